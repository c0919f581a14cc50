"""The stand-in's retail environment."""

from tau_bench.envs.retail.env import MockRetailDomainEnv as MockRetailDomainEnv
