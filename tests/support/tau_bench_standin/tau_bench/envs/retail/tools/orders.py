"""Order tools."""

import json
from typing import Any, Dict

from tau_bench.envs.tool import Tool


def _order_schema(name: str, description: str, extra: Dict[str, Any]) -> Dict[str, Any]:
    props = {"order_id": {"type": "string", "description": "The order id, such as '#1001'."}, **extra}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }


class GetOrder(Tool):
    """Read: an order as JSON; raises KeyError for an unknown id."""

    @staticmethod
    def invoke(data: Dict[str, Any], order_id: str) -> str:
        # an unknown id raises KeyError: the environment turns it into an "Error: ..." observation
        return json.dumps(data["orders"][order_id])

    @staticmethod
    def get_info() -> Dict[str, Any]:
        return _order_schema("get_order", "Get an order's status, items and shipping address.", {})


class CancelOrder(Tool):
    """Write: cancel a pending order."""

    @staticmethod
    def invoke(data: Dict[str, Any], order_id: str, reason: str) -> str:
        order = data["orders"].get(order_id)
        if order is None:
            return "Error: order not found"
        if order["status"] != "pending":
            return "Error: only pending orders can be cancelled"
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        return json.dumps(order)

    @staticmethod
    def get_info() -> Dict[str, Any]:
        return _order_schema("cancel_order", "Cancel a pending order.",
                             {"reason": {"type": "string", "description": "Why the user cancels, such as 'no longer needed'."}})


class UpdateOrderAddress(Tool):
    """Write: change a pending order's address."""

    @staticmethod
    def invoke(data: Dict[str, Any], order_id: str, address: str) -> str:
        order = data["orders"].get(order_id)
        if order is None:
            return "Error: order not found"
        if order["status"] != "pending":
            return "Error: only pending orders can be changed"
        order["address"] = address
        return json.dumps(order)

    @staticmethod
    def get_info() -> Dict[str, Any]:
        return _order_schema("update_order_address", "Change the shipping address of a pending order.",
                             {"address": {"type": "string", "description": "The new address, in one line."}})
