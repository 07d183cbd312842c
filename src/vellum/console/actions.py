"""The console's mutating actions: the same admin HTTP endpoints the shell and scripts call
(``docs/gc.md``, ``docs/autorecovery.md``), sent with the configured admin token as
``Authorization: Bearer <token>``, so the bookie that receives the call checks it exactly as it
checks anyone's. The console holds no authority of its own: without a token it offers no action,
and a token a bookie refuses is reported with the bookie's reason.

Each action is described by an ``Action`` (what it does, in a sentence the confirmation page
shows) and run by ``run_action``; the target bookie must be one the console currently sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vellum.console.bookies import AdminHttp, AdminHttpError, BookieView


class ActionRefused(Exception):
    """The action cannot run as asked; the text is for the page."""


@dataclass(frozen=True)
class Action:
    name: str
    title: str
    needs: str  # "up": a bookie whose admin HTTP answers; "down": a stopped bookie (decommission)
    method: str
    path: str
    body: dict[str, Any] | None
    danger: str = ""


ACTIONS: dict[str, Action] = {
    a.name: a for a in (
        Action("gc", "Force garbage collection", "up", "PUT", "/api/v1/bookie/gc", {}),
        Action("suspend-compaction", "Suspend major and minor compaction", "up", "PUT",
               "/api/v1/bookie/gc/suspend_compaction", {"suspendMajor": True, "suspendMinor": True}),
        Action("resume-compaction", "Resume major and minor compaction", "up", "PUT",
               "/api/v1/bookie/gc/resume_compaction", {"resumeMajor": True, "resumeMinor": True}),
        Action("autorecovery-enable", "Enable re-replication for the whole cluster", "any", "PUT",
               "/api/v1/autorecovery/status?enabled=true", None),
        Action("autorecovery-disable", "Disable re-replication for the whole cluster", "any", "PUT",
               "/api/v1/autorecovery/status?enabled=false", None,
               danger="While disabled, no lost replica is copied back: the auditor keeps marking ledgers."),
        Action("decommission", "Decommission a stopped bookie", "down", "PUT",
               "/api/v1/autorecovery/decommission", None,
               danger="Its ledgers are copied to other bookies, then its cookie is deleted: the bookie id "
                      "cannot rejoin with its old disks."),
    )
}


def describe(action: Action, target: str | None) -> str:
    if action.needs == "any":
        return action.title
    if action.name == "gc" and target == "*":
        return "Force garbage collection on every bookie that answers"
    return f"{action.title}: {target}"


async def run_action(http: AdminHttp, action: Action, target: str | None, views: list[BookieView]) -> str:
    """Run ``action`` on ``target`` (a bookie id, ``*`` for every bookie that answers, or None
    for a cluster-wide switch); returns what happened, for the page. Raises ``ActionRefused``."""
    if not http.has_token:
        raise ActionRefused("the console has no admin token: start it with --admin-token-file to enable actions")
    up = [v for v in views if v.up and v.http_url]
    # a cluster-wide call goes through a bookie the token may go to (else the first, whose
    # refusal then says why)
    through = sorted(up, key=lambda v: http.token_refusal(v.http_url or "") is not None)
    by_id = {v.bookie_id: v for v in views}
    if action.needs == "down":
        v = by_id.get(target or "")
        if v is None or v.up:
            raise ActionRefused(f"{target} is not a stopped bookie the console knows: decommission moves the "
                                "ledgers of a bookie that is shut down")
        if not up:
            raise ActionRefused("no bookie answers on its admin HTTP API to run the decommission")
        return await _call(http, through[0], action, {"bookie_src": v.bookie_id},
                           f"decommission of {v.bookie_id} started by {through[0].bookie_id}")
    if action.needs == "any":
        if not up:
            raise ActionRefused("no bookie answers on its admin HTTP API")
        return await _call(http, through[0], action, action.body, f"done through {through[0].bookie_id}")
    targets = up if target == "*" else [v for v in up if v.bookie_id == target]
    if not targets:
        raise ActionRefused(f"bookie {target} does not answer on its admin HTTP API")
    if len(targets) == 1:
        return await _call(http, targets[0], action, action.body, targets[0].bookie_id)
    done, refused = [], []
    for v in targets:  # one bookie's refusal (e.g. plain http) does not stop the others
        try:
            done.append(await _call(http, v, action, action.body, v.bookie_id))
        except ActionRefused as e:
            refused.append(str(e))
    if not done:
        raise ActionRefused("; ".join(refused))
    return "; ".join(done + [f"not done: {r}" for r in refused])


async def _call(http: AdminHttp, view: BookieView, action: Action, body: Any, what: str) -> str:
    assert view.http_url is not None
    try:
        answer = await http.call(view.http_url, action.path, action.method, body, timeout_s=10.0)
    except AdminHttpError as e:
        if e.status in (401, 403):
            raise ActionRefused(f"{view.bookie_id} refused the console's admin token: {e}") from None
        raise ActionRefused(f"{view.bookie_id}: {e}") from None
    shown = answer if isinstance(answer, str) else ", ".join(f"{k}: {v}" for k, v in answer.items()) \
        if isinstance(answer, dict) else str(answer)
    return f"{what}: {shown}"
