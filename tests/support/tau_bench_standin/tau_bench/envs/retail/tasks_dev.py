"""Tasks of the split ``dev`` (our own)."""

from tau_bench.types import Action, Task

TASKS_DEV = [
    Task(
        user_id="alan_1912",
        instruction="You are Alan Turing, your email is alan@example.com. Your delivered rotor is broken and you insist on speaking to a human.",
        actions=[
            Action(name="transfer_to_human_agents", kwargs={"summary": "delivered rotor of order #1002 is broken; wants a human"}),
        ],
        outputs=[],
    ),
]
