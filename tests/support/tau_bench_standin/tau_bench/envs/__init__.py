"""``get_env`` as in tau-bench's ``tau_bench/envs/__init__.py``: build a domain environment by name."""

from typing import Optional, Union

from tau_bench.envs.base import Env
from tau_bench.envs.user import UserStrategy


def get_env(
    env_name: str,
    user_strategy: Union[str, UserStrategy],
    user_model: str,
    task_split: str,
    user_provider: Optional[str] = None,
    task_index: Optional[int] = None,
) -> Env:
    """The environment ``env_name`` (only ``retail`` in this stand-in).

    Raises:
        ValueError: unknown environment or task split (tau-bench's messages).
    """
    if env_name == "retail":
        from tau_bench.envs.retail import MockRetailDomainEnv

        return MockRetailDomainEnv(
            user_strategy=user_strategy,
            user_model=user_model,
            task_split=task_split,
            user_provider=user_provider,
            task_index=task_index,
        )
    raise ValueError(f"Unknown environment: {env_name}")
