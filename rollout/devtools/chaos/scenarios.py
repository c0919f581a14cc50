"""The faults the bench knows, in the order it runs them: name -> scenario."""

from __future__ import annotations

from typing import Callable

from rollout.devtools.chaos import faults as F
from rollout.devtools.chaos import faults_engine as E
from rollout.devtools.chaos import faults_infra as I
from rollout.devtools.chaos import faults_storage as S
from rollout.devtools.chaos import faults_trainer as T
from rollout.devtools.chaos.job import Fault

SCENARIOS: dict[str, Callable[[Fault], None]] = {
    "actor_sigkill_x3": F.fault_actor_sigkill_x3, "server_kill": F.fault_server_kill, "router_restart": F.fault_router_restart,
    "faulty_server": F.fault_faulty_server, "user_sim_429_500": F.fault_user_sim_429_500,
    "driver_sigkill_resume": F.fault_driver_sigkill_resume, "driver_sigterm_resume": F.fault_driver_sigterm_resume,
    "node_removal": F.fault_node_removal,
    "disk_full": S.fault_disk_full, "journal_torn_tail": S.fault_journal_torn_tail, "journal_corrupt_line": S.fault_journal_corrupt_line,
    "weight_update_half_done": T.fault_weight_update_half_done, "straggler": T.fault_straggler,
    "user_sim_server_death": I.fault_user_sim_server_death, "actor_oom": I.fault_actor_oom, "network_partition": I.fault_network_partition,
    "engine_server_kill": E.fault_engine_server_kill,
}
FAULTS = tuple(SCENARIOS)
