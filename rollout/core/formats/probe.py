"""The start-up probe of a format rendered with a tokenizer's own chat template (docs/design.md
invariant 1): does appending per-message deltas reproduce the template exactly, and which
renderings are prefix-stable. :meth:`ChatTemplate.probe <rollout.core.formats.template.ChatTemplate.probe>`
runs :func:`probe_template`; the worker refuses to start on a report that is not ``ok``.
"""

from __future__ import annotations

from typing import Any

from rollout.core.formats.protocol import TemplateError, TemplateReport

__all__ = ["TemplateError", "TemplateReport", "probe_template"]

_SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
_USER = {"role": "user", "content": "Hello."}
_CALL = {"type": "function", "function": {"name": "lookup", "arguments": {"id": "1"}}}
# The shapes of the assistant turn a delta may follow, and the messages that may follow it.
_ASSISTANTS = {
    "plain": {"role": "assistant", "content": "Sure."},
    "thinking": {"role": "assistant", "content": "<think>\nreasoning\n</think>\n\nSure."},
    "tool_call": {"role": "assistant", "content": "", "tool_calls": [_CALL]},
}
_NEXTS = {
    "user": [{"role": "user", "content": "Next question?"}],
    "tool": [{"role": "tool", "content": '{"ok": true}'}],
}


def probe_template(template: Any) -> TemplateReport:
    """Check that exact delta tokenization works with ``template``; report prefix stability.

    Cases cover the roles in use: a user turn and a tool result after an assistant turn with
    and without ``<think>`` reasoning and with a tool call.

    Args:
        template: a :class:`~rollout.core.formats.template.ChatTemplate` (its ``end_of_turn``,
            ``turn_tail``, ``render``, ``render_delta``, ``encode`` and ``verbatim_affixes``
            are used).

    Returns:
        A :class:`TemplateReport`; ``report.ok`` is False when the delta construction is unsound.
        Raises nothing for a template it can render; a :class:`TemplateError` met on the way is a
        problem of the report.
    """
    rep = TemplateReport(end_of_turn=template.end_of_turn, turn_tail="")
    try:
        rep.turn_tail = template.turn_tail
        template.render_delta([{"role": "user", "content": "x"}])
    except TemplateError as e:
        rep.problems.append(str(e))
        return rep
    for nk, new in _NEXTS.items():
        ref = template.render_delta(new)
        for ak, asst in _ASSISTANTS.items():
            case = f"{nk}_after_{ak}"
            hist = [_SYSTEM, _USER, asst]
            rep.prefix_stable[case] = template.render(hist + new, True, tools=False).startswith(template.render(hist, False, tools=False))
            # the delta of `new` when the previous assistant turn had this shape
            try:
                same = template.render_delta(new, after=asst) == ref
            except TemplateError:
                same = False
            rep.delta_independent[case] = same
            if not same:
                rep.problems.append(
                    f"the template renders a {nk} message differently after an assistant turn of kind "
                    f"'{ak}': appending deltas cannot reproduce it exactly"
                )
        # Canonical tokenization: ids(prefix) + ids(delta) == ids(prefix + delta)?
        prefix = template.render([_SYSTEM, _USER], True, tools=False) + "Sure." + template.end_of_turn
        rep.canonical_boundary[nk] = template.encode(prefix) + template.encode(ref) == template.encode(prefix + ref)
        rep.verbatim_roles[nk] = template.verbatim_affixes(nk) is not None
    return rep
