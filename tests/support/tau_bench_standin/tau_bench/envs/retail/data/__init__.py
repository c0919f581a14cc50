"""The shop's data, read from ``shop.json`` on every call (as tau-bench reads its JSON files)."""

import json
import os
from typing import Any, Dict

DATA_PATH = os.path.join(os.path.dirname(__file__), "shop.json")


def load_data() -> Dict[str, Any]:
    with open(DATA_PATH, encoding="utf-8") as f:
        return json.load(f)
