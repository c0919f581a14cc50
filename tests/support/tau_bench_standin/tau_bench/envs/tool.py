"""tau-bench's tool base class: tools are classes with two static methods."""

import abc
from typing import Any, Dict


class Tool(abc.ABC):
    @staticmethod
    def invoke(*args, **kwargs) -> str:
        """Run the tool on the environment's data (``data=`` keyword) and return its text output."""
        raise NotImplementedError

    @staticmethod
    def get_info() -> Dict[str, Any]:
        """The tool's OpenAI function schema."""
        raise NotImplementedError
