"""E-mail on a critical failure (the red team's ``reporting.notify_on_critical``), over SMTP configured from the
environment. A notification that cannot be sent is counted in the report with its reason (the command prints one
line for it); it never changes a verdict.

| variable | meaning | default |
|---|---|---|
| ``FAIRNESS_SMTP_HOST`` | the SMTP server (required to send) | none: every notification fails, counted |
| ``FAIRNESS_SMTP_PORT`` | its port | 465 with ``FAIRNESS_SMTP_SSL``, else 25 |
| ``FAIRNESS_SMTP_SSL`` | ``true``: TLS from the first byte (SMTPS) | false |
| ``FAIRNESS_SMTP_STARTTLS`` | ``true``: upgrade the connection with STARTTLS | false |
| ``FAIRNESS_SMTP_USER``, ``FAIRNESS_SMTP_PASSWORD`` | log in when set | no login |
| ``FAIRNESS_SMTP_FROM`` | the sender | ``fairness-exporter@<this host's name>`` |
"""

from __future__ import annotations

import os
import smtplib
import socket
import ssl
from email.message import EmailMessage
from typing import Any, Final

TIMEOUT: Final = 20.0
SHOWN_FAILURES: Final = 20


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def message(report: dict[str, Any], sender: str, recipient: str) -> EmailMessage:
    """The e-mail for one recipient: the verdict, the critical failures and where the report is."""
    critical = [r for r in report["results"] if not r["passed"] and r["severity"] == "critical"]
    msg = EmailMessage()
    msg["Subject"] = (f"[fairness-exporter] {report['suite']} {report['verdict']}: {len(critical)} critical "
                      f"failure(s) for {report['model_id']}")  # fmt: skip
    msg["From"], msg["To"] = sender, recipient
    lines = [f"Model: {report['model_id']} (version {report.get('model_version') or 'not given'})",
             f"Suite: {report['suite']}, run at {report['timestamp']}",
             f"Verdict: {report['verdict']}: {report['passed']}/{report['total_tests']} passed", "",
             "Critical failures:"]  # fmt: skip
    for r in critical[:SHOWN_FAILURES]:
        technique = r["details"].get("technique_description") or r["details"].get("technique", "")
        said = r["details"].get("summary")  # a red-team test's evasions and baseline failures
        lines.append(f"  - {r['category']} / {r['test_name']}: {technique}" + (f"\n    {said}" if said else ""))
    if len(critical) > SHOWN_FAILURES:
        lines.append(f"  ... and {len(critical) - SHOWN_FAILURES} more in the report")
    where = report.get("reporting", {}).get("destination")
    lines += ["", f"Full report: {where}" if where else "The full JSON report is in the CI job's output."]
    msg.set_content("\n".join(lines) + "\n")
    return msg


def send(report: dict[str, Any], recipients: list[str]) -> dict[str, Any]:
    """One e-mail per recipient; what was sent and what failed (with why), for the report."""
    host = os.environ.get("FAIRNESS_SMTP_HOST")
    sent: list[str] = []
    errors: list[str] = []
    use_ssl = _flag("FAIRNESS_SMTP_SSL")
    port = int(os.environ.get("FAIRNESS_SMTP_PORT") or (465 if use_ssl else 25))
    sender = os.environ.get("FAIRNESS_SMTP_FROM") or f"fairness-exporter@{socket.getfqdn()}"
    for recipient in recipients:
        try:
            if not host:
                raise OSError("FAIRNESS_SMTP_HOST is not set")
            smtp_class = smtplib.SMTP_SSL if use_ssl else smtplib.SMTP
            with smtp_class(host, port, timeout=TIMEOUT) as smtp:
                if _flag("FAIRNESS_SMTP_STARTTLS"):
                    smtp.starttls(context=ssl.create_default_context())
                if os.environ.get("FAIRNESS_SMTP_USER"):
                    smtp.login(os.environ["FAIRNESS_SMTP_USER"], os.environ.get("FAIRNESS_SMTP_PASSWORD", ""))
                smtp.send_message(message(report, sender, recipient))
        except (OSError, smtplib.SMTPException) as exc:  # every way an SMTP exchange fails
            errors.append(f"{recipient} via {host}:{port}: {type(exc).__name__}: {exc}")
        else:
            sent.append(recipient)
    return {"to": recipients, "sent": len(sent), "failed": len(errors), "errors": errors}
