"""The shop's tools (``ALL_TOOLS``, in schema order)."""

from tau_bench.envs.retail.tools.calculate import Calculate
from tau_bench.envs.retail.tools.orders import CancelOrder, GetOrder, UpdateOrderAddress
from tau_bench.envs.retail.tools.transfer_to_human_agents import TransferToHumanAgents
from tau_bench.envs.retail.tools.users import FindUserByEmail

ALL_TOOLS = [
    FindUserByEmail,
    GetOrder,
    CancelOrder,
    UpdateOrderAddress,
    Calculate,
    TransferToHumanAgents,
]
