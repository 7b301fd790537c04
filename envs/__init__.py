"""Built-in domains (installed as ``envace_gym.envs``). Each folder is one domain, documented like a
Gymnasium environment; their ids are registered here, in one place, lazily (a module is imported when its id is
made), each with its limits. A change to what a domain's episodes are (its task generator, its data, its limits)
registers a new version (``units-v1``) beside the old one, so that every published figure keeps its id."""

from __future__ import annotations

from envace_gym.domains.spec import DomainSpec

BUILTIN_DOMAINS = (
    DomainSpec("units-v0", "envace_gym.envs.units:UnitsDomain", max_turns=4),
    DomainSpec("bank-v0", "envace_gym.envs.bank:BankDomain", max_turns=8),
    DomainSpec("travel-v0", "envace_gym.envs.travel:TravelDomain", max_turns=8),
    DomainSpec("lights-v0", "envace_gym.envs.lights:LightsDomain", max_turns=3),  # lights:easy-v0, lights:favorite-v0
    # Benchmark families (need `make benchmarks`), made with a member: "bfcl:<category>-v0", "tau2:<domain>-v0".
    # Their data is that of the pinned benchmark packages (the Makefile's BENCH_SPEC).
    DomainSpec("bfcl-v0", "envace_gym.envs.bfcl:BFCLDomain"),  # max_turns per category: the domain's own
    DomainSpec("tau2-v0", "envace_gym.envs.tau2:Tau2Domain", max_turns=20),
)


def register_builtin_domains() -> None:
    from envace_gym.domains import list_domains, register_domain

    for spec in BUILTIN_DOMAINS:
        if spec.id not in list_domains():
            register_domain(spec.id, spec.entry_point, max_turns=spec.max_turns, kwargs=spec.kwargs)
