from __future__ import annotations

import hashlib
import json
import re
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest
from envace_gym.envs import BUILTIN_DOMAINS

import envace_gym  # noqa: F401  (registers the ids)
from envace_gym import (
    Domain,
    DomainError,
    ReferenceRecorder,
    RewardResult,
    TaskNotFoundError,
    ToolCall,
    ToolExecutor,
    ToolFailure,
    list_domains,
    make_domain,
    register_domain,
    tool,
)
from envace_gym.domains import LazyTasks, Task, check_split
from envace_gym.domains.check import check_domain
from envace_gym.testing import ScriptedPolicy
from envace_gym.tools import canonical_json

BUILTIN = ("units", "bank", "travel", "lights")


def key(task) -> str:
    return canonical_json([task.prompt, task.user_turns, task.initial_state])


@pytest.mark.parametrize("name", BUILTIN)
def test_tasks_are_deterministic_and_splits_disjoint(name):
    a, b = make_domain(name), make_domain(name)
    assert [t.to_dict() for t in a.tasks("train")[:20]] == [t.to_dict() for t in b.tasks("train")[:20]]
    train = {key(t) for t in a.tasks("train")[:300]}
    test = {key(t) for t in a.tasks("test")}
    assert len(test) == len(a.tasks("test")) == 200
    assert not train & test
    assert all(t.split == "test" and t.id.startswith(f"{name}/test/") for t in a.tasks("test")[:10])
    other_seed = make_domain(name, seed=1).tasks("train")[0]
    assert key(other_seed) != key(a.tasks("train")[0])


@pytest.mark.parametrize("name", BUILTIN)
def test_reference_calls_are_valid_and_their_results_real(name):
    domain = make_domain(name)
    for task in domain.tasks("train")[:25]:
        assert set(task.tools) <= set(domain.tools.names)
        executor = domain.make_executor(task)
        for call, result in task.reference_pairs():
            assert domain.tools.validate(call, task.tools).ok, (task.id, call)
            assert executor.execute(call) == result, task.id  # replaying the reference reproduces its results
        assert task.reference[-1].calls == ()  # every reference ends with an answer


@pytest.mark.parametrize("name", BUILTIN)
def test_reference_replay_with_the_real_executor_earns_full_reward(name):
    env = gym.make("EnvACE-Rehearsal-v0", domain=name, policy=ScriptedPolicy([]), executor="real")
    for index in range(8):
        env.reset(options={"task": f"{name}/{index:03d}"})
        task = env.unwrapped.episode.task
        for turn in task.reference:
            obs, reward, terminated, truncated, info = env.step(turn.text)
        assert terminated and not truncated and reward == 1.0 and info["success"], (task.id, info["reward_checks"])


@pytest.mark.parametrize("name", BUILTIN)
def test_a_corrupted_trajectory_earns_less(name):
    env = gym.make("EnvACE-Rehearsal-v0", domain=name, policy=ScriptedPolicy([]), executor="real")
    env.reset(options={"task": f"{name}/001"})
    task = env.unwrapped.episode.task
    for turn in task.reference:
        if turn.calls:  # change the first argument of every call
            call = turn.calls[0]
            first = next(iter(call.arguments))
            value = call.arguments[first]
            wrong = (
                value + 1
                if isinstance(value, float)
                else ("Nobody" if first in ("owner", "passenger_name") else "LIS" if value != "LIS" else "VIE")
                if isinstance(value, str)
                else value
            )
            text = ToolCall(call.name, {**call.arguments, first: wrong}).to_text()
        else:
            text = "Done."
        obs, reward, terminated, truncated, info = env.step(text)
        if terminated or truncated:
            break
    assert reward < 1.0 and not info["success"]


def test_executor_state_is_isolated_per_episode():
    domain = make_domain("bank")
    task = domain.tasks("train")[0]
    before = canonical_json(task.initial_state)
    one, two = domain.make_executor(task), domain.make_executor(task)
    call = next(c for c, _ in task.reference_pairs() if c.name == "transfer")
    one.execute(call)
    assert canonical_json(two.snapshot()) == before == canonical_json(task.initial_state)
    assert canonical_json(one.snapshot()) != before


def test_tool_failure_is_a_normal_response_and_dispatch_is_by_table():
    domain = make_domain("bank")
    executor = domain.make_executor(domain.tasks("train")[0])
    assert executor.execute(ToolCall("get_balance", {"account_id": "ACC-0"})) == {"error": "no account ACC-0"}
    with pytest.raises(KeyError):
        executor.execute(ToolCall("_account", {"account_id": "x"}))  # a private helper is not a tool
    assert sorted(type(executor).tool_functions) == sorted(domain.tools.names)


def test_task_lookup():
    domain = make_domain("units")
    assert domain.task("units/007").id == "units/train/007"
    assert domain.task("units/007", split="test").id == "units/test/007"
    assert domain.task("units/test/003") is domain.tasks("test")[3]
    with pytest.raises(TaskNotFoundError):
        domain.task("units/train/99999")


def test_check_split_names_the_splits():
    assert check_split("train") == "train" and check_split("test") == "test"
    with pytest.raises(DomainError, match=r"^split 'validation' must be one of \['train', 'test'\]$"):
        check_split("validation")
    with pytest.raises(DomainError, match=r"^tasks.jsonl:3: split 'dev' must be one of"):
        check_split("dev", "tasks.jsonl:3")


def test_every_kind_of_domain_refuses_an_unknown_split_alike(tmp_path):
    examples = Path(__file__).resolve().parents[1] / "examples"
    for source in ("units", "bank", str(write_folder(tmp_path)), str(examples / "data" / "envace.jsonl")):
        with pytest.raises(DomainError, match=r"split 'validation' must be one of \['train', 'test'\]"):
            make_domain(source).tasks("validation")


def test_lazy_tasks_build_each_task_once_on_first_access():
    built = []

    def build(index: int) -> Task:
        built.append(index)
        return Task(id=f"t/{index}", domain="t", prompt=f"task {index}")

    tasks = LazyTasks(4, build)
    assert len(tasks) == 4 and built == []
    assert tasks[2].id == "t/2" and tasks[-2] is tasks[2] and built == [2]
    assert [t.id for t in tasks[1:3]] == ["t/1", "t/2"] and built == [2, 1]
    assert [t.id for t in tasks] == ["t/0", "t/1", "t/2", "t/3"] and sorted(built) == [0, 1, 2, 3]
    with pytest.raises(IndexError):
        tasks[4]
    with pytest.raises(IndexError):
        tasks[-5]
    assert built == [2, 1, 0, 3]  # nothing out of range was built


def test_registry_of_domain_names():
    assert {f"{name}-v0" for name in BUILTIN} <= set(list_domains())
    with pytest.raises(DomainError, match="already registered"):
        register_domain("bank-v0", Domain)
    with pytest.raises(DomainError, match=r"already registered, as \['bank-v0'\]"):  # "bank" means bank-v0
        register_domain("bank", Domain)
    with pytest.raises(DomainError, match="unknown domain"):
        make_domain("no-such-domain")


# What each versioned id's episodes are, fingerprinted when the id was registered (its limits, its system prompt,
# its first tasks of each split with their tools): a change to a task generator, to benchmark data or to a limit
# registers a new version (envs/__init__.py) instead of changing what a published figure's id names.
FROZEN = {
    "units-v0": "7c0f40e5620b6a5e",
    "bank-v0": "b3561b99f5726ff5",
    "travel-v0": "779c94d35227e0d4",
    "lights-v0": "efe2c5c5a281bfc7",
    "lights:easy-v0": "d2e8d0f463ee00e3",
    "lights:favorite-v0": "1dd08c307f1e0464",
    "bfcl:simple_python-v0": "80c7134bcf376896",
    "bfcl:multi_turn_base-v0": "1ca0e47681e888b0",
    "tau2:retail-v0": "c0599e40d0136bf2",
}
BENCHMARK_PACKAGES = {"bfcl": "bfcl_eval", "tau2": "tau2"}


def fingerprint(domain: Domain, count: int = 5) -> str:
    tasks = [task for split in ("train", "test") for task in domain.tasks(split)[:count]]
    what = {
        "max_turns": domain.max_turns,
        "system_prompt": domain.system_prompt,
        "tasks": [{**t.to_dict(), "tools": domain.tools_for(t).to_openai(domain.whitelist(t))} for t in tasks],
    }
    return hashlib.sha256(canonical_json(what).encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    "domain_id",  # a benchmark family's loads seconds of its package's data: make test checks those
    [pytest.param(d, marks=pytest.mark.slow) if d.startswith(("tau2:", "bfcl:")) else d for d in sorted(FROZEN)],
)
def test_a_versioned_id_is_frozen(domain_id):
    family = domain_id.partition(":")[0]
    if family in BENCHMARK_PACKAGES:
        pytest.importorskip(BENCHMARK_PACKAGES[family], reason=f"{domain_id}: benchmark data not installed")
    domain = make_domain(domain_id)
    assert domain.id == domain_id
    assert fingerprint(domain) == FROZEN[domain_id], f"{domain_id} changed: register a new version instead"


def test_every_builtin_id_is_fingerprinted():
    families = {domain_id.partition(":")[0].rpartition("-v")[0] for domain_id in FROZEN}
    assert {spec.name for spec in BUILTIN_DOMAINS} <= families | {"bfcl", "tau2"}  # a family: its members above
    assert {"bfcl", "tau2"} <= {domain_id.partition(":")[0] for domain_id in FROZEN}


def test_versioned_ids_resolve_like_gymnasiums(monkeypatch):
    """A bare name is its latest version; a family's member takes the family's version and limits; an unknown
    version is refused with the ones that exist."""
    monkeypatch.setattr(envace_gym.domains.registry, "_SPECS", dict(envace_gym.domains.registry._SPECS))
    units = make_domain("units")
    assert (units.id, units.name, units.max_turns) == ("units-v0", "units", 4)  # the spec's limit
    assert [t.id for t in units.tasks("test")[:2]] == [t.id for t in make_domain("units-v0").tasks("test")[:2]]
    easy = make_domain("lights:easy")
    assert (easy.id, easy.name, easy.max_turns) == ("lights:easy-v0", "lights:easy", 3)
    register_domain("units-v1", "envace_gym.envs.units:UnitsDomain", max_turns=2, kwargs={"seed": 7})
    assert make_domain("units").id == "units-v1" and make_domain("units").max_turns == 2
    assert make_domain("units-v0").max_turns == 4  # the old id still names what it named
    assert make_domain("units-v1").tasks("train")[0].prompt != units.tasks("train")[0].prompt  # its kwargs
    with pytest.raises(DomainError, match=r"'units-v9': no such version; registered: \['units-v0', 'units-v1'\]"):
        make_domain("units-v9")
    assert gym.make("EnvACE-Rehearsal-v0", domain="units-v0", policy=ScriptedPolicy(["hi"])).unwrapped.domain.id == (
        "units-v0"
    )


def test_an_unknown_name_is_answered_with_a_close_match(monkeypatch):
    with pytest.raises(DomainError, match=r"unknown domain 'bnak'; did you mean 'bank'\? registered: \[.*'bank-v0'"):
        make_domain("bnak")
    monkeypatch.setattr(sys, "path", list(sys.path))  # a failed "module:attr" import may add the cwd to sys.path
    with pytest.raises(DomainError, match=r"did you mean 'bfcl:parallel'\?"):  # a family typo keeps the member
        make_domain("bfc:parallel")
    with pytest.raises(DomainError, match=r"unknown domain 'qqqqqq'; registered: \[") as nothing_close:
        make_domain("qqqqqq")
    assert "did you mean" not in str(nothing_close.value)


def test_a_domain_is_described_without_building_or_importing_it(tmp_path, monkeypatch):
    monkeypatch.setattr(
        envace_gym.domains.registry, "_SPECS", dict(envace_gym.domains.registry._SPECS)
    )  # leaves no trace
    (tmp_path / "heavy_domain_example.py").write_text(
        'raise RuntimeError("importing this module is what listing must not do")\n\n\n'
        'class Heavy:\n    """\n    ## Description\n\n    Loads a large corpus. On build only.\n    """\n\n\n'
        'class Labelled:\n    """Not this."""\n\n    description: str = "A labelled one."\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    def never_built() -> Domain:
        """A factory that fails when called.

        Listing must not call it."""
        raise AssertionError("describing a domain built it")

    register_domain("heavy", "heavy_domain_example:Heavy")
    register_domain("labelled", "heavy_domain_example:Labelled")
    register_domain("missing", "no_such_module_anywhere:Domain")
    register_domain("factory", never_built)
    assert envace_gym.domains.registry.describe_domain("heavy") == "Loads a large corpus"  # heading skipped
    assert envace_gym.domains.registry.describe_domain("labelled") == "A labelled one."  # `description` wins
    assert envace_gym.domains.registry.describe_domain("missing") == ""
    assert envace_gym.domains.registry.describe_domain("factory") == "A factory that fails when called"
    assert envace_gym.domains.registry.describe_domain("units") == "Unit conversion: one tool call, one number."
    assert envace_gym.domains.registry.describe_domain("units-v0") == "Unit conversion: one tool call, one number."
    assert "heavy_domain_example" not in sys.modules
    with pytest.raises(DomainError, match="did you mean 'heavy'"):
        envace_gym.domains.registry.describe_domain("heavyy")


def test_checklist_reward():
    r = RewardResult.from_checks({"a": True, "b": False}, {"a": 3.0})
    assert r.score == 0.75 and not r.success
    assert RewardResult.from_checks({}).score is None


class CounterTools(ToolExecutor):
    @tool(returns={"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]})
    def increment(self, by: int) -> dict:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        if by < 0:
            raise ToolFailure("only forward")
        self.state["value"] = self.state.get("value", 0) + by
        return {"value": self.state["value"]}


class NameTools(ToolExecutor):
    @tool
    def register(self, name: str, tool: str) -> dict:
        """Register a user and their tool.

        Args:
            name: The user's name.
            tool: Their tool.
        """
        return {"registered": name, "tool": tool}


def test_reference_recorder_takes_tools_whose_parameters_are_called_name_or_tool():
    recorder = ReferenceRecorder(NameTools())
    assert recorder.call("register", name="Ana", tool="saw") == {"registered": "Ana", "tool": "saw"}
    (turn,) = recorder.turns
    assert turn.calls[0].name == "register" and turn.calls[0].arguments == {"name": "Ana", "tool": "saw"}


def write_folder(tmp_path, with_executor: bool = True):
    folder = tmp_path / "counter"
    folder.mkdir()
    (folder / "domain.json").write_text(json.dumps({"name": "counter", "description": "count", "max_turns": 3}))
    (folder / "tools.json").write_text(json.dumps([t.to_openai() for t in CounterTools.tool_schemas()]))
    task = {
        "id": "counter/1",
        "prompt": "Add 2.",
        "split": "train",
        "reference": [
            {"calls": [{"name": "increment", "arguments": {"by": 2}}], "results": [{"value": 2}]},
            {"content": "It is 2."},
        ],
        "initial_state": {"value": 0},
        # a state check replays calls on the executor; without one, the calls themselves are checked
        "expected": {"state": {"value": 2}}
        if with_executor
        else {"calls": [{"name": "increment", "arguments": {"by": 2}}]},
    }
    task["expected"]["answer_numbers"] = [2]
    (folder / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    if with_executor:
        (folder / "executor.py").write_text(
            textwrap.dedent(
                """
                from envace_gym import ToolExecutor, tool

                class Executor(ToolExecutor):
                    @tool
                    def increment(self, by: int) -> dict:
                        '''Add to the counter.

                        Args:
                            by: How much to add.
                        '''
                        self.state["value"] += by
                        return {"value": self.state["value"]}
                """
            )
        )
    return folder


def test_folder_domain_plays_in_real_mode(tmp_path):
    folder = write_folder(tmp_path)
    domain = make_domain(str(folder))
    assert domain.name == "counter" and domain.tools["increment"].returns is not None
    env = gym.make("EnvACE-Rehearsal-v0", domain=str(folder), policy=ScriptedPolicy([]), executor="real")
    env.reset(options={"task": "counter/1"})
    env.step(ToolCall("increment", {"by": 2}).to_text())
    *_, reward, terminated, _, info = env.step("It is 2.")
    assert terminated and reward == 1.0


def test_folder_domain_without_executor_refuses_real_mode(tmp_path):
    folder = write_folder(tmp_path, with_executor=False)
    env = gym.make("EnvACE-Rehearsal-v0", domain=str(folder), policy=ScriptedPolicy([]), executor="real")
    with pytest.raises(DomainError, match="no real executor"):
        env.reset()


def test_malformed_folder_is_a_domain_error(tmp_path):
    folder = write_folder(tmp_path)
    (folder / "tasks.jsonl").write_text('{"id": "x"}\n')
    with pytest.raises(DomainError, match="tasks.jsonl:1"):
        make_domain(folder)
    (folder / "tools.json").write_text("not json")
    with pytest.raises(DomainError, match="cannot read"):
        make_domain(folder)


def _rewrite_task(folder, **changes):
    task = json.loads((folder / "tasks.jsonl").read_text())
    (folder / "tasks.jsonl").write_text(json.dumps({**task, **changes}) + "\n")


FOLDER_MISTAKES = {
    # name: (what the user got wrong, what the error must say)
    "a tool the executor lacks": (
        lambda f: (f / "tools.json").write_text(
            json.dumps(
                [
                    *json.loads((f / "tools.json").read_text()),
                    {"name": "reset", "description": "Reset.", "parameters": {"type": "object", "properties": {}}},
                ]
            )  # fmt: skip
        ),
        r"tools.json: \['reset'\] have no @tool method in .*executor.py's Executor",
    ),
    "a reference call to an unknown tool": (
        lambda f: _rewrite_task(f, reference=[{"calls": [{"name": "decrement", "arguments": {}}], "results": [{}]}]),
        r"tasks.jsonl:1: task 'counter/1' names tools that tools.json does not define: \['decrement'\]",
    ),
    "duplicate task ids": (
        lambda f: (f / "tasks.jsonl").write_text((f / "tasks.jsonl").read_text() * 2),
        r"tasks.jsonl:2: task id 'counter/1' is already used on line 1",
    ),
    "an unknown split": (
        lambda f: _rewrite_task(f, split="validation"),
        r"tasks.jsonl:1: split 'validation' must be one of \['train', 'test'\]",
    ),
    "a state check with no executor": (
        lambda f: (f / "executor.py").unlink(),
        r"tasks.jsonl:1: task 'counter/1' checks expected.state, which replays the calls on a real executor; add .*executor.py",
    ),
    "an MCP tools/list result as tools.json": (
        lambda f: (f / "tools.json").write_text(json.dumps({"tools": [{"name": "increment", "inputSchema": {}}]})),
        r"tools.json: holds an object with a 'tools' key \(an MCP tools/list result\); write the list itself",
    ),
    "a misspelt key in tools.json (the tool would load with no arguments)": (
        lambda f: (f / "tools.json").write_text(
            (f / "tools.json").read_text().replace('"parameters"', '"paramaters"')
        ),
        r"tools.json: tool 0 \('increment'\): tool 'increment': unknown key 'paramaters'; did you mean 'parameters'\?",
    ),
    "a required name no property defines": (
        lambda f: (f / "tools.json").write_text(
            (f / "tools.json").read_text().replace('"required": ["by"]', '"required": ["bye"]')
        ),
        r"tools.json: tool 'increment': parameters requires \['bye'\], which its properties do not define \(and no "
        r"other property is allowed, so no call can pass\); 'bye': did you mean 'by'\?",
    ),
    "a reference call that breaks its own schema": (
        lambda f: _rewrite_task(f, reference=[{"calls": [{"name": "increment", "arguments": {"by": "2"}}],
                                               "results": [{"value": 2}]}]),  # fmt: skip
        r"tasks.jsonl:1: task 'counter/1': reference turn 0 calls 'increment', which fails validation: .*'2' is not "
        r"of type 'integer'",
    ),
    "a reward.py without a score function": (
        lambda f: (f / "reward.py").write_text("def reward(task, trajectory):\n    return 1.0\n"),
        r"reward.py must define a function score\(task, trajectory\)",
    ),
    "an MCP tool spelled input_schema": (
        lambda f: (f / "tools.json").write_text(
            json.dumps([{"name": "increment", "input_schema": {"type": "object"}}])
        ),
        r"tools.json: tool 0 \('increment'\) has 'input_schema'; MCP spells it 'inputSchema'",
    ),
}


@pytest.mark.parametrize("mistake", sorted(FOLDER_MISTAKES))
def test_folder_mistakes_are_domain_errors_at_load_time(tmp_path, mistake):
    folder = write_folder(tmp_path)
    make_domain(folder)  # the folder as written loads
    break_it, message = FOLDER_MISTAKES[mistake]
    break_it(folder)
    with pytest.raises(DomainError, match=message):
        make_domain(folder)


LIBRARY_FILE = str(Path(__file__).resolve().parents[1] / "examples" / "custom_domain.py")


def test_a_domain_from_the_users_code_by_module_or_file(tmp_path, monkeypatch):
    by_file = make_domain(f"{LIBRARY_FILE}:LibraryDomain", num_tasks={"train": 3})
    assert by_file.name == "library" and len(by_file.tasks("train")) == 3
    with_dataclass = tmp_path / "with_dataclass.py"  # a file module is a real module (dataclasses need that)
    with_dataclass.write_text(
        "from __future__ import annotations\nfrom dataclasses import dataclass\n"
        f"exec(open({LIBRARY_FILE!r}).read().split('def main()')[0])\n"
        "@dataclass\nclass Settings:\n    size: int = 2\n\n"
        "def small() -> LibraryDomain:\n    return LibraryDomain(num_tasks={'train': Settings().size})\n"
    )
    assert len(make_domain(f"{with_dataclass}:small").tasks("train")) == 2
    (tmp_path / "my_domains.py").write_text(
        f"import importlib.util\nspec = importlib.util.spec_from_file_location('lib', {LIBRARY_FILE!r})\n"
        "lib = importlib.util.module_from_spec(spec); spec.loader.exec_module(lib)\n"
        "LIBRARY = lib.LibraryDomain(num_tasks={'train': 2})\n"
    )
    monkeypatch.chdir(tmp_path)  # a module in the working directory, as `envace --domain my_domains:LIBRARY` finds it
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    instance = make_domain("my_domains:LIBRARY")
    assert instance.name == "library" and len(instance.tasks("train")) == 2
    for ref, says in [
        ("no_such_module_xyz:Thing", "no module 'no_such_module_xyz'"),
        (str(tmp_path / "missing.py") + ":X", "no file"),
        ("my_domains:NOPE", "has no attribute 'NOPE'"),
        ("my_domains:spec", "not a Domain"),
        ("bfcl:no_such_category", "unknown BFCL category"),  # a registered family still reads as one
        (":LibraryDomain", "no module before"),
    ]:
        with pytest.raises(DomainError, match=says):
            make_domain(ref)


def test_domains_declared_by_installed_packages(tmp_path, monkeypatch):
    """An entry point in group envace_gym.domains makes a package's domain a name like the built-in ones."""
    dist = tmp_path / "library_domains-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: library-domains\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[envace_gym.domains]\nlibrary-ep = library_example:LibraryDomain\nlibrary-one = library_example:ONE\n"
    )
    (tmp_path / "library_example.py").write_text(
        Path(LIBRARY_FILE).read_text() + "\nONE = LibraryDomain(num_tasks={'train': 1})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        envace_gym.domains.registry, "_SPECS", dict(envace_gym.domains.registry._SPECS)
    )  # leaves no trace
    monkeypatch.setattr(envace_gym.domains.registry, "_FROM_ENTRY_POINTS", set())
    assert {"library-ep", "library-one"} <= set(list_domains())
    assert make_domain("library-ep", num_tasks={"train": 2}).name == "library"
    assert len(make_domain("library-one").tasks("train")) == 1  # an entry point may name an instance
    register_domain("library-ep", make_domain("library-one"))  # the package's own module registering the name
    assert len(make_domain("library-ep").tasks("train")) == 1


def test_a_reference_turn_needs_one_result_per_call(tmp_path):
    folder = write_folder(tmp_path)
    _rewrite_task(folder, reference=[{"calls": [{"name": "increment", "arguments": {"by": 2}}], "results": []}])
    with pytest.raises(DomainError, match="reference turn 0 has 1 call\\(s\\) and 0 result\\(s\\)"):
        make_domain(folder)


# -- the domain check, the reward contract, late errors (docs/domains.md) -------------------------------------
PHARMACY = '''
from envace_gym import GeneratedDomain, ReferenceRecorder, Task, ToolExecutor, tool


class PharmacyTools(ToolExecutor):
    @tool
    def dispense(self, drug: str) -> dict:
        """Dispense a drug.

        Args:
            drug: The drug's name.
        """
        self.state.setdefault("dispensed", []).append(drug)
        return {"ok": True}


class PharmacyDomain(GeneratedDomain):
    name = "pharmacy"
    executor_class = PharmacyTools
    num_tasks = {"train": 20, "test": 5}

    def sample_params(self, rng):
        return {"drug": str(rng.choice(["aspirin", "ibuprofen", "paracetamol", "codeine", "insulin", "morphine"]))
                + str(int(rng.integers(1000)))}

    def build_task(self, params, task_id, split):
        rec = ReferenceRecorder(PharmacyTools({}))
        rec.call("DISPENSE_CALL", drug=params["drug"])
        rec.answer(f"Dispensed {params['drug']}.")
        return Task(task_id, self.name, f"Dispense {params['drug']}.", split, reference=rec.turns,
                    expected={"state": rec.executor.snapshot(), "answer_contains": [params["drug"]]})
'''


def _pharmacy(tmp_path, tool_called="dispense", **replace):
    text = PHARMACY.replace("DISPENSE_CALL", tool_called)
    for old, new in replace.items():
        text = text.replace(old, new)
    (tmp_path / "pharmacy.py").write_text(text)
    return f"{tmp_path / 'pharmacy.py'}:PharmacyDomain"


def test_a_typo_in_a_python_reference_solution_is_named_when_the_domain_loads(tmp_path):
    """It surfaced at reset, as a 12-frame KeyError from `envace train`, while `envace domains` called it fine."""
    assert make_domain(_pharmacy(tmp_path)).name == "pharmacy"
    broken = _pharmacy(tmp_path, "dispence")
    with pytest.raises(DomainError, match=r"domain 'pharmacy': .*pharmacy.py \(PharmacyDomain\): train task 0 does "
                       r"not build: DomainError: the reference solution calls 'dispence', which PharmacyTools does not "
                       r"define; did you mean 'dispense'\? .*\(at .*pharmacy.py:\d+ \(build_task\)\)"):  # fmt: skip
        make_domain(broken)
    for command in (["train", "--mode", "sft", "--domain", broken, "--model", "no/such-model"],
                    ["eval", "--domain", broken], ["demo", "--domain", broken], ["domains", broken]):  # fmt: skip
        assert _one_line_error(command) and "did you mean 'dispense'" in _one_line_error(command)


def _one_line_error(argv):
    """What `envace <argv>` prints on stderr when it fails as a user error (exit status 2), before any model loads."""
    import contextlib
    import io

    from envace_gym.cli.main import main

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        assert main(argv) == 2
    lines = stderr.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("envace: error: "), lines
    return lines[0]


def test_a_python_file_without_its_class_is_answered_with_the_form_to_use(tmp_path):
    """`--domain pyd/pharmacy.py` answered "unknown domain", with no hint of the `file.py:Class` form."""
    _pharmacy(tmp_path)
    with pytest.raises(DomainError, match=r"is a Python file: name the Domain class \(or factory\) in it, as "
                       r"'.*pharmacy.py:PharmacyDomain' \(it defines \['PharmacyDomain'\]\)"):  # fmt: skip
        make_domain(str(tmp_path / "pharmacy.py"))


def test_a_generator_that_cannot_produce_its_declared_tasks_says_how_many_it_found(tmp_path, monkeypatch):
    """`envace domains --details` printed "1000 train, 200 test tasks" for a generator that cannot produce them."""
    import envace_gym.domains.domain as domain_module

    monkeypatch.setattr(domain_module, "STALE_DRAWS", 500)  # a few hundred draws, not twenty thousand
    few = _pharmacy(tmp_path, **{"+ str(int(rng.integers(1000)))": ""})  # six drugs: six distinct tasks at most
    assert len([*make_domain(few, num_tasks={"train": 1, "test": 0}).tasks("train")]) == 1  # what exists: fine
    says = r"pharmacy: cannot generate 20 distinct train tasks: [1-6] found, then 500 draws of sample_params gave no new"
    with pytest.raises(DomainError, match=says):
        [*make_domain(few, num_tasks={"test": 0}).tasks("train")]
    # as declared (20 train, 5 test), the load-time check already meets it, on whichever split runs out first
    assert re.search(r"cannot generate (20|5) distinct (train|test) tasks: [0-6] found, then 500 draws",
                     _one_line_error(["domains", "--details", few]))  # fmt: skip


def test_the_check_finds_what_loads_but_is_wrong(tmp_path):
    """Recorded results that differ from the executor's (a warning) and a reward that cannot give the reference
    full marks (an error); `envace domains NAME --check` prints both and exits with 1."""
    folder = write_folder(tmp_path)
    _rewrite_task(folder, reference=[{"calls": [{"name": "increment", "arguments": {"by": 2}}], "results": [{"value": 3}]},
                                     {"content": "It is 2."}], expected={"state": {"value": 2}, "answer_numbers": [5]})  # fmt: skip
    findings = check_domain(make_domain(folder))
    where = f"{folder / 'tasks.jsonl'}:1: task 'counter/1'"
    assert [(f.level, f.where) for f in findings] == [("warning", where), ("error", where)]
    assert 'returns {"value":2} when replayed, but the task records {"value":3}' in findings[0].message
    assert "the reward gives the reference solution 0.5, not full marks (failed checks: ['answer_numbers'])" in findings[1].message
    out = _run_cli(["domains", str(folder), "--check"], status=1)
    assert "counter: 1 train, 0 test tasks checked" in out and "1 error(s), 1 warning(s)" in out


def _run_cli(argv, status=0):
    import contextlib
    import io

    from envace_gym.cli.main import main

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == status
    return stdout.getvalue()


@pytest.mark.parametrize("name", ["units", "bank", "travel", "lights", "library", "openai", "sharegpt", "envace"])
def test_the_check_finds_nothing_in_the_built_in_and_example_domains(name):
    data = Path(LIBRARY_FILE).parent / "data"
    source = {"library": f"{LIBRARY_FILE}:LibraryDomain", "openai": str(data / "openai.jsonl"),
              "sharegpt": str(data / "sharegpt.jsonl"), "envace": str(data / "envace.jsonl")}.get(name, name)  # fmt: skip
    out = _run_cli(["domains", source, "--check", "--rewards", "5"])
    assert out.splitlines()[0].endswith("no findings"), out


@pytest.mark.parametrize(
    ("returned", "score", "checks"),
    [("RewardResult(0.5, {'a': True, 'b': False})", 0.5, {"a": True, "b": False}),
     ("1", 1.0, {"full_marks": True}), ("0.25", 0.25, {"full_marks": False}), ("None", None, {})],
)  # fmt: skip
def test_score_may_return_a_reward_result_a_number_or_none(tmp_path, returned, score, checks):
    folder = write_folder(tmp_path)
    (folder / "reward.py").write_text(f"from envace_gym import RewardResult\n\ndef score(task, trajectory):\n    return {returned}\n")
    env = gym.make("EnvACE-Rehearsal-v0", domain=str(folder), policy=ScriptedPolicy([]), executor="real")
    env.reset(options={"task": "counter/1"})
    *_, reward, terminated, _, info = env.step("It is 0.")
    assert terminated and info["reward_checks"] == checks and info["reward_masked"] is (score is None)
    assert reward == (score or 0.0)


def test_a_score_of_the_wrong_kind_is_a_typed_error_naming_the_domain(tmp_path):
    """Returning a float used to give ENVIRONMENT_ERROR (AttributeError: 'float' object has no attribute 'score');
    a float in [0, 1] is now a reward, and anything else names the domain."""
    folder = write_folder(tmp_path)
    (folder / "reward.py").write_text("def score(task, trajectory):\n    return 'perfect'\n")
    env = gym.make("EnvACE-Rehearsal-v0", domain=str(folder), policy=ScriptedPolicy([]), executor="real")
    env.reset(options={"task": "counter/1"})
    *_, reward, _, _, info = env.step("It is 0.")
    assert info["reward_masked"] and info["reward_error"].startswith("DomainError: domain 'counter': score() returned "
                                                                      "str 'perfect'; return a RewardResult")  # fmt: skip
    findings = check_domain(make_domain(folder))
    assert any(f.level == "error" and "score() returned str 'perfect'" in f.message for f in findings)


def test_a_tool_that_raises_is_reported_with_its_file_and_line(tmp_path, caplog):
    """It gave `EXECUTION_ERROR renew_loan failed: KeyError: 'nope'` with no file or line."""
    folder = write_folder(tmp_path)
    code = (folder / "executor.py").read_text()  # a bug the reference (by=2) does not reach: the domain loads
    code = code.replace('self.state["value"] += by', 'self.state["value" if by == 2 else "nope"] += by')
    (folder / "executor.py").write_text(code)
    line = next(n for n, text in enumerate(code.splitlines(), 1) if '"nope"' in text)
    env = gym.make("EnvACE-Rehearsal-v0", domain=str(folder), policy=ScriptedPolicy([]), executor="real")
    env.reset(options={"task": "counter/1"})
    with caplog.at_level("WARNING"):
        *_, info = env.step(ToolCall("increment", {"by": 3}).to_text())
    error = info["calls"][0]["error"]
    assert error["code"] == "EXECUTION_ERROR" and error["origin"] == f"{folder / 'executor.py'}:{line} (increment)"
    assert "origin" not in json.dumps(info["messages"][-1])  # the agent sees the error, not the author's file
    assert f"raised at {folder / 'executor.py'}:{line} (increment)" in caplog.text


def test_a_folder_executor_needs_no_docstrings(tmp_path):
    """docs/domains.md: the schemas are tools.json's; executor.py's docstrings are not read (they were, and a
    method without one failed with SchemaError: ... it has no docstring)."""
    folder = write_folder(tmp_path)
    code = (folder / "executor.py").read_text()
    (folder / "executor.py").write_text(code[: code.index("'''")] + code[code.rindex("'''") + 3 :])
    assert make_domain(folder).tools["increment"].description == "Add to the counter."
