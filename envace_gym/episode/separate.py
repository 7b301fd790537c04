"""``separate`` rehearsal, the paper's: each call the Rehearse role answers gets a fresh prompt of its own (the
candidate tools, the task's reference executions as privileged context, the conversation, the raw Act turn), and
each rehearsal is a training row of its own. The episode's tool turn then carries the results as tool messages.

A rehearsal mode is a module with a ``tool_turn(episode, states, action, info)`` generator, named in
:data:`envace_gym.episode.config.REHEARSAL_MODES` and registered in :data:`envace_gym.episode.episode.TOOL_TURNS`; it
answers the calls ``states`` routed to ``"rehearsal"`` (yielding its generation requests, as
:class:`~envace_gym.episode.episode.Episode` steps do), grows the chat by the tool turn through the episode's own
methods (``add_messages``, ``append_text``, ...) and returns the training rows it made, which the episode keeps.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from ..errors import ErrorCode
from ..parsing.act import RESULT_OPEN, parse_execution_result
from ..policy.protocol import Generation
from ..rehearsal.prompt import rehearsal_messages, rehearsal_prompt
from ..text import clean_text
from ..tools.schema import ToolCall
from .responses import overflow, payload, record_rehearsal, tool_message
from .types import CallState, GenerationRequest, Role, Row

if TYPE_CHECKING:
    from .episode import Episode

Rehearsals = Generator[list[GenerationRequest], list[Generation], list[Row]]  # returns the rows it made


def tool_turn(episode: Episode, states: list[CallState], action: str, info: dict[str, Any]) -> Rehearsals:
    """Rehearse the turn's calls routed to the Rehearse role, then append every call's tool message."""
    pending = [s for s in states if s.route == "rehearsal"]
    rows = (yield from rehearse(episode, pending, action, info)) if pending else []
    episode.add_messages([tool_message(s.call, payload(s)) for s in states], [s.call for s in states])
    return rows


def rehearse(
    episode: Episode, states: list[CallState], action: str, info: dict[str, Any], user: bool = False
) -> Rehearsals:
    """Rehearse the calls of ``states`` (``user``: the user's own) in one batch of fresh prompts; resample results
    that fail a ``returns`` schema. Returns the rows, one per attempt."""
    cfg = episode.config.rehearsal
    registry = episode.user_registry if user else episode.registry
    prompts = {s.call.id: rehearse_prompt(episode, s.call, action, user) for s in states}
    budget = episode.max_context - cfg.max_new_tokens
    todo = []
    for state in states:
        if len(prompts[state.call.id]) <= budget:
            todo.append(state)
        else:
            state.error = overflow(len(prompts[state.call.id]), budget)
    params = cfg.sampling()
    rows: list[Row] = []
    for attempt in range(cfg.returns_resamples + 1):
        if not todo:
            break
        generations = yield [GenerationRequest(prompts[s.call.id], params) for s in todo]
        retry = []
        for state, gen in zip(todo, generations, strict=True):
            call = state.call
            text = (RESULT_OPEN + "\n" if cfg.prefill else "") + gen.text
            with episode.budget:
                read = parse_execution_result(text, episode.config.limits)
                error = read.error or registry[call.name].validate_result(read.result)  # type: ignore[index]
            record_rehearsal(info, call, attempt, gen, error)
            rows.append(
                Row(Role.REHEARSE, gen.prompt_ids, gen.completion_ids, gen.logprobs, (1,) * len(gen.completion_ids))
            )
            if error is None:
                state.response, state.error = read.result, None
            else:
                state.error = error
                if error.code is ErrorCode.RESULT_SCHEMA_MISMATCH:
                    retry.append(state)
        todo = retry
    return rows


def rehearse_prompt(episode: Episode, call: ToolCall, action: str, user: bool = False) -> tuple[int, ...]:
    """The ids of the simulator prompt for ``call``, made during the Act turn ``action`` (the conversation before
    that turn is the history; the turn itself is shown raw). A call of the user's own tools (``user``) is shown
    after the whole conversation, with the user's tools as the candidates and the reference's own user calls as
    its reference executions."""
    messages = episode.messages
    history = messages[:-1] if messages[-1]["role"] == "assistant" and not user else messages
    if user and episode.user_registry is not None:
        registry, candidates = episode.user_registry, list(episode.user_registry)
        reference = episode.task.reference_pairs(user=True)
    else:
        registry, candidates, reference = episode.registry, episode.candidates, episode.reference_pairs
    cfg = episode.config.rehearsal
    chat = rehearsal_messages(call, registry[call.name], candidates, reference, history, action, cfg)
    for message in chat:  # reference data may hold unencodable text; the history and the Act turn are untrusted
        message["content"] = clean_text(message["content"])
    chat[1]["content"] = episode.chat.neutralize(chat[1]["content"])
    return tuple(episode.chat.encode(rehearsal_prompt(episode.tokenizer, chat, cfg)))
