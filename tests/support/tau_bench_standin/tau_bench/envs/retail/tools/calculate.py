"""The calculator, which evaluates its argument with eval (as tau-bench's)."""

from typing import Any, Dict

from tau_bench.envs.tool import Tool

_ALLOWED = set("0123456789+-*/(). ")


class Calculate(Tool):
    """Arithmetic with eval, rounded to 2 decimals (reads no data)."""

    @staticmethod
    def invoke(data: Dict[str, Any], expression: str) -> str:
        # like tau-bench's calculator: a character filter, then Python's eval without builtins
        # (so '9**9**9**9' passes the filter and runs for ever)
        if not set(expression) <= _ALLOWED:
            return "Error: invalid characters in expression"
        try:
            return str(round(float(eval(expression, {"__builtins__": None}, {})), 2))
        except Exception as e:
            return f"Error: {e}"

    @staticmethod
    def get_info() -> Dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": "calculate",
                "description": "Calculate the result of an arithmetic expression of numbers, + - * /, parentheses and spaces.",
                "parameters": {
                    "type": "object",
                    "properties": {"expression": {"type": "string", "description": "The expression, such as '2 + 2'."}},
                    "required": ["expression"],
                },
            },
        }
