"""Built-in domains (installed as ``envace_gym.envs``). Each folder is one domain, documented like a
Gymnasium environment; they are registered here, lazily, by name."""

from __future__ import annotations

BUILTIN_DOMAINS = {
    "units": "envace_gym.envs.units:UnitsDomain",
    "bank": "envace_gym.envs.bank:BankDomain",
    "travel": "envace_gym.envs.travel:TravelDomain",
    "lights": "envace_gym.envs.lights:LightsDomain",
    # Benchmark families (need `make benchmarks`): "bfcl:<category>", "tau2:<domain>".
    "bfcl": "envace_gym.envs.bfcl:BFCLDomain",
    "tau2": "envace_gym.envs.tau2:Tau2Domain",
}


def register_builtin_domains() -> None:
    from envace_gym.domains import list_domains, register_domain

    for name, factory in BUILTIN_DOMAINS.items():
        if name not in list_domains():
            register_domain(name, factory)
