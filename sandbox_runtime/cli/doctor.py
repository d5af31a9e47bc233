"""``sandbox-runtime doctor``: start a canary sandbox and show that every protection is in force; name the engine,
the policy, where the state lives, and whether the audit trail is whole."""

from __future__ import annotations

import argparse
import json
import sys

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.cli.common import EXIT_FAILED, EXIT_OK, open_runtime, table
from sandbox_runtime.state.audit import AuditCheck

__all__ = ["cmd_doctor"]


def cmd_doctor(args: argparse.Namespace) -> int:
    with open_runtime(args) as runtime:
        report = runtime.doctor()
        limits = runtime.store.outputs_limits()
        if args.json:
            outputs = {"outputs_max_bytes": limits.max_bytes, "outputs_files_max": limits.files_max}
            ok = report.ok and not report.not_enforced  # a backend that confines nothing is no pass
            state = runtime.state.report().model_dump(mode="json")
            audit = runtime.state.audit.verify()
            ok = ok and audit.ok and not audit.lost_entries
            shown = {"ok": ok, "outputs": outputs, "state": state, "audit": audit.model_dump() | {"ok": audit.ok}}
            print(json.dumps(report.model_dump(mode="json") | shown, indent=2))
            return EXIT_OK if ok else EXIT_FAILED
        engine = report.engine
        if report.not_enforced:
            return _doctor_unconfined(runtime, report.backend, report.not_enforced)
        print(
            f"engine   {report.backend}: {engine.product} {engine.engine_version} (API {engine.api_version}), "
            f"runc {engine.runc_version}, {engine.runsc_version or 'runsc not installed'}, "
            f"runtimes: {', '.join(engine.runtimes)}"
        )
        print(
            f"host     {engine.operating_system}, kernel {engine.kernel_version}, cgroup v{engine.cgroup_version} "
            f"({engine.cgroup_driver})"
        )
        print(
            f"sandbox  runtime {report.runtime}, image {report.image}, disk quota mode: {report.quota_mode}"
            + ("" if report.quota_mode == "loop" else " (not kernel-enforced: run as root for 'loop')")
        )
        print(
            f"outputs  attachments per conversation: at most {limits.files_max:,} (tools.outputs_files_max), "
            f"{limits.max_bytes:,} bytes of distinct content (tools.outputs_max_bytes); the same content is stored once"
        )
        print(f"policy   {runtime.policy.name} ({runtime.policy.digest()})")
        print(_state_line(runtime))
        audit = runtime.state.audit.verify()
        print(_audit_line(audit) + "\n")
        print(
            table(
                [["ok" if c.ok else "FAIL", c.name, c.expected, c.actual] for c in report.checks],
                ["", "check", "expected", "seen inside the canary"],
            )
        )
        if not report.ok:
            print("\n" + report.summary(), file=sys.stderr)
            return EXIT_FAILED
        if not audit.ok or audit.lost_entries:
            print("\nthe audit trail is not whole: see the audit line above", file=sys.stderr)
            return EXIT_FAILED
        print(f"\nall {len(report.checks)} protections are in force")
        return EXIT_OK


def _audit_line(audit: AuditCheck) -> str:
    if not audit.ok:
        return f"audit    BROKEN at entry {audit.first_bad}: {audit.problem} (sandbox-runtime audit verify)"
    lost = (
        f"; {audit.lost_entries:,} entries were LOST (the store refused them: see the log's AUDIT ENTRY LOST lines)"
        if audit.lost_entries
        else ""
    )
    return f"audit    whole: {audit.entries:,} entries, head {audit.head_hash[:16]}…{lost}"


def _state_line(runtime: Runtime) -> str:
    store = runtime.state.report()
    return (
        f"state    {runtime.state_dir}; records on {store.store} {store.where} (schema version {store.schema_version})"
    )


def _doctor_unconfined(runtime: Runtime, backend: str, not_enforced: tuple[str, ...]) -> int:
    """doctor for a backend that confines nothing (the fake): what it leaves out, loudly; exit 1."""
    print(f"engine   {backend}: no engine; code runs as processes of this host")
    print(f"policy   {runtime.policy.name} ({runtime.policy.digest()})")
    print(_state_line(runtime))
    print(_audit_line(runtime.state.audit.verify()) + "\n")
    print(table([["NOT ENFORCED", said] for said in not_enforced], ["", "protection"]))
    print(
        f"\nthe {backend} backend confines nothing: never run untrusted code on it "
        "(set sandbox.backend = 'docker' for sandboxes)",
        file=sys.stderr,
    )
    return EXIT_FAILED
