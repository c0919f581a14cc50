"""Tasks of the split ``test`` (our own)."""

from tau_bench.types import Action, Task

TASKS_TEST = [
    Task(
        user_id="ada_1815",
        instruction="You are Ada Lovelace, your email is ada@example.com. You want to cancel your pending order #1001 because you no longer need it.",
        actions=[
            Action(name="find_user_by_email", kwargs={"email": "ada@example.com"}),
            Action(name="get_order", kwargs={"order_id": "#1001"}),
            Action(name="cancel_order", kwargs={"order_id": "#1001", "reason": "no longer needed"}),
        ],
        outputs=[],
    ),
    Task(
        user_id="alan_1912",
        instruction="You are Alan Turing, your email is alan@example.com. You want to know what your order #1002 would cost with a 10% discount.",
        actions=[
            Action(name="find_user_by_email", kwargs={"email": "alan@example.com"}),
            Action(name="get_order", kwargs={"order_id": "#1002"}),
            Action(name="calculate", kwargs={"expression": "(40 + 20) * 0.9"}),
        ],
        outputs=["54.0"],
    ),
]
