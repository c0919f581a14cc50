"""The data types of tau-bench's ``tau_bench/types.py`` (pydantic models, same names and fields)."""

from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel

RESPOND_ACTION_NAME = "respond"
RESPOND_ACTION_FIELD_NAME = "content"


class Action(BaseModel):
    """An agent action: a tool name and its arguments, or ``respond`` with ``{"content": text}``."""

    name: str
    kwargs: Dict[str, Any]


class Task(BaseModel):
    """A task: the user, the gold actions, the user simulator's instruction, the outputs the agent must say."""

    user_id: str
    actions: List[Action]
    instruction: str
    outputs: List[str]


class RewardOutputInfo(BaseModel):
    """The outputs check: 1.0 when every output was said; which were."""

    r_outputs: float
    outputs: Dict[str, bool]


class RewardActionInfo(BaseModel):
    """The data check: whether the data hash equals the gold replay's, and that hash."""

    r_actions: float
    gt_data_hash: str


class RewardResult(BaseModel):
    """The reward in [0, 1], the check behind it and the gold actions."""

    reward: float
    info: Union[RewardOutputInfo, RewardActionInfo]
    actions: List[Action]


class SolveResult(BaseModel):
    """What an agent's ``solve`` returns (unused by the adapter)."""

    reward: float
    messages: List[Dict[str, Any]]
    info: Dict[str, Any]
    total_cost: Optional[float] = None


class EnvInfo(BaseModel):
    """Per-step info: the task, who answered (``user`` or the tool name), the user's cost and, when done, the reward."""

    task: Task
    source: Optional[str] = None
    user_cost: Optional[float] = None
    reward_info: Optional[RewardResult] = None


class EnvResponse(BaseModel):
    """``Env.step``'s result."""

    observation: str
    reward: float
    done: bool
    info: EnvInfo


class EnvResetResponse(BaseModel):
    """``Env.reset``'s result: the user's first message."""

    observation: str
    info: EnvInfo
