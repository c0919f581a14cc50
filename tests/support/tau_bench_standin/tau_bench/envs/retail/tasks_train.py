"""Tasks of the split ``train`` (our own)."""

from tau_bench.types import Action, Task

TASKS_TRAIN = [
    Task(
        user_id="grace_1906",
        instruction="You are Grace Hopper, your email is grace@example.com. You moved: ship your pending order #1003 to 1 Navy Way, Arlington instead.",
        actions=[
            Action(name="find_user_by_email", kwargs={"email": "grace@example.com"}),
            Action(name="update_order_address", kwargs={"order_id": "#1003", "address": "1 Navy Way, Arlington"}),
        ],
        outputs=[],
    ),
]
