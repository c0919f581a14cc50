"""User look-up."""

import json
from typing import Any, Dict

from tau_bench.envs.tool import Tool


class FindUserByEmail(Tool):
    """Read: the user id of an email."""

    @staticmethod
    def invoke(data: Dict[str, Any], email: str) -> str:
        for user_id, user in data["users"].items():
            if user["email"].lower() == email.lower():
                return json.dumps({"user_id": user_id, "name": user["name"]})
        return "Error: user not found"

    @staticmethod
    def get_info() -> Dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": "find_user_by_email",
                "description": "Find a user's id by their email address.",
                "parameters": {
                    "type": "object",
                    "properties": {"email": {"type": "string", "description": "The user's email, such as 'ada@example.com'."}},
                    "required": ["email"],
                },
            },
        }
