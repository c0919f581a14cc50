"""The terminate tool."""

from typing import Any, Dict

from tau_bench.envs.tool import Tool


class TransferToHumanAgents(Tool):
    """Hand the user to a human (a terminate tool of the environment)."""

    @staticmethod
    def invoke(data: Dict[str, Any], summary: str) -> str:
        return "Transfer successful"

    @staticmethod
    def get_info() -> Dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": "transfer_to_human_agents",
                "description": "Transfer the user to a human agent, with a summary of their issue.",
                "parameters": {
                    "type": "object",
                    "properties": {"summary": {"type": "string", "description": "A summary of the user's issue."}},
                    "required": ["summary"],
                },
            },
        }
