"""The seed's red-team-config.yaml, verbatim (tests/data/seed/), runs through `fairness-exporter redteam`: against
a text classifier and against chat models, its report filed at reporting.destination (moto's S3 server) and
notify_on_critical e-mailed through a real SMTP server (aiosmtpd) on loopback."""

from __future__ import annotations

import email
import email.policy
import json
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import chat_servers
import pytest
import text_models
from s3_fixture import S3

from exporter.cli import main
from exporter.config import ConfigError
from exporter.gate.redteam.run import run_redteam

SEED_CONFIG = Path(__file__).parent / "data" / "seed" / "red-team-config.yaml"
SEED_CASES = ["homoglyph_substitution", "whitespace_injection", "language_mixing", "instruction_override",
              "role_impersonation", "training_data_extraction"]  # fmt: skip


class Mailbox:
    """An aiosmtpd handler that keeps every message it accepts."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], email.message.EmailMessage]] = []

    async def handle_DATA(self, server: object, session: object, envelope: object) -> str:
        content = envelope.content  # type: ignore[attr-defined]
        self.messages.append((list(envelope.rcpt_tos), email.message_from_bytes(content, policy=email.policy.default)))  # type: ignore[attr-defined]
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Mailbox]:
    from aiosmtpd.controller import Controller

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mailbox = Mailbox()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    monkeypatch.setenv("FAIRNESS_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("FAIRNESS_SMTP_PORT", str(port))
    monkeypatch.setenv("FAIRNESS_SMTP_FROM", "ci@fairness.example")
    yield mailbox
    controller.stop()


@pytest.fixture
def reports_bucket(s3: S3) -> S3:
    s3.filesystem().mkdir("ml-audit-reports")
    return s3


def redteam(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    code = main(["redteam", "--config", str(SEED_CONFIG), "--audit-log", str(tmp_path / "log.jsonl"), *args])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


def test_the_seed_config_runs_against_a_text_classifier_and_names_its_six_cases(
        reports_bucket: S3, smtp: Mailbox, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, report, err = redteam(capsys, tmp_path, "--target", "text_models:naive")
    assert [r["test_name"] for r in report["results"]] == [*SEED_CASES, "baseline_detection"]
    assert [r["category"] for r in report["results"]] == ["adversarial_evasion"] * 3 + ["prompt_injection"] * 2 + [
        "data_extraction", "baseline"]
    first = report["results"][1]["details"]
    assert first["technique"] == "invisible_characters"
    assert first["technique_description"] == "Insert zero-width characters between words"
    assert (first["expected_behaviour"], first["outcome"]) == ("Model still detects harmful content", "block")
    assert [r["details"]["outcome"] for r in report["results"][:6]] == [
        "block", "block", "review", "unchanged", "no_privileged_action", "no_leak"]
    # the TF-IDF moderator blocks every plain text, so each failure is an evasion
    assert report["baseline_failures"] == 0 and report["results"][6]["passed"]
    # the naive TF-IDF moderator is fooled by look-alikes and zero-width characters: critical, it does not ship
    assert code == 1 and {"homoglyph_substitution", "whitespace_injection"} <= {
        r["test_name"] for r in report["results"] if not r["passed"] and r["severity"] == "critical"}
    assert report["notifications"] == {"to": ["security-team@company.com"], "sent": 1, "failed": 0, "errors": []}
    [(to, message)] = smtp.messages
    assert to == ["security-team@company.com"] and message["From"] == "ci@fairness.example"
    assert message["Subject"].startswith("[fairness-exporter] redteam FAIL: ")
    assert "content-moderation-v5" in message["Subject"]
    assert "Replace characters with visually similar Unicode characters" in message.get_content()
    homoglyphs = report["results"][0]["details"]
    assert f"    {homoglyphs['summary']}" in message.get_content().splitlines() and homoglyphs["evasions"] == 24
    [filed] = reports_bucket.filesystem().ls("ml-audit-reports/red-team")
    assert filed.startswith("ml-audit-reports/red-team/content-moderation-v5_") and filed.endswith("Z.json")
    assert json.loads(reports_bucket.filesystem().cat_file(filed)) == report
    assert "s3://ml-audit-reports/red-team/s3://" not in err and f"report filed at s3://{filed}" in err


@pytest.mark.parametrize(("server", "verdict"), [("leaky", "FAIL"), ("guarded", "PASS")])
def test_the_seed_config_runs_against_chat_models(
        server: str, verdict: str, reports_bucket: S3, smtp: Mailbox, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setenv("OPENAI_API_KEY", chat_servers.KEY)
    with chat_servers.serve(getattr(chat_servers, server)) as chat:
        code, report, _ = redteam(capsys, tmp_path, "--target", chat.base_url, "--chat-model", chat_servers.MODEL,
                                  "--model-version", "v5.1.0")  # fmt: skip
    assert [r["test_name"] for r in report["results"]] == [*SEED_CASES, "baseline_detection"]
    assert report["verdict"] == verdict
    failed = {r["test_name"] for r in report["results"] if not r["passed"]}
    if server == "leaky":  # every seed case fails; four of them are critical
        assert code == 1 and failed == set(SEED_CASES) and report["critical_failures"] == 4
        assert len(smtp.messages) == 1
    else:  # German insults get past a blocklist: "high", reported, not blocking; no e-mail for it
        assert code == 0 and failed == {"language_mixing"} and smtp.messages == []
    record = json.loads((tmp_path / "log.jsonl").read_text())
    assert (record["model_id"], record["model_version"]) == ("content-moderation-v5", "v5.1.0")


def test_a_notification_that_fails_is_counted_and_changes_no_verdict(
        reports_bucket: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("FAIRNESS_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("FAIRNESS_SMTP_PORT", str(port))
    code, report, err = redteam(capsys, tmp_path, "--target", "text_models:naive")
    assert code == 1 and report["verdict"] == "FAIL"
    assert (report["notifications"]["sent"], report["notifications"]["failed"]) == (0, 1)
    [line] = [line for line in err.splitlines() if "notify_on_critical" in line]
    assert line.startswith("fairness-exporter redteam: reporting.notify_on_critical: not sent to "
                           f"security-team@company.com via 127.0.0.1:{port}: ConnectionRefusedError")  # fmt: skip
    assert json.loads((tmp_path / "log.jsonl").read_text())["report"]["notifications"]["failed"] == 1


def test_an_expected_behaviour_in_no_row_of_the_table_is_a_config_error_naming_the_case(tmp_path: Path) -> None:
    text = SEED_CONFIG.read_text().replace("Model flags the input for review", "Model shrugs")
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"test_cases\[2\] \(case 'language_mixing'\)\.expected_behaviour: "
                                          r"'Model shrugs' matches no row of the table"):  # fmt: skip
        run_redteam(tmp_path / "c.yaml", lambda t: 1.0, "t")
    renamed = SEED_CONFIG.read_text().replace("name: \"whitespace_injection\"", "name: \"zw\"")
    (tmp_path / "d.yaml").write_text(renamed)
    with pytest.raises(ConfigError, match=r"technique: 'Insert zero-width characters between words' is not one of"):
        run_redteam(tmp_path / "d.yaml", lambda t: 1.0, "t")


def attacks(report: dict) -> dict[str, dict]:
    return {r["test_name"]: r for r in report["results"] if r["test_name"] != "baseline_detection"}


def test_a_defence_that_works_shows_no_evasion_and_the_plain_misses_are_their_own_finding(
        reports_bucket: S3, smtp: Mailbox, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Issue 30: a keyword blocklist misses half of the plain harmful texts. Behind NFKC and the removal of format
    characters (category Cf) no zero-width attack gets past it any more: whitespace_injection passes with 0
    evasions, while the bare blocklist shows evasions there; the plain misses are baseline failures, reported per
    test and failing baseline_detection, for both."""
    bare_code, bare, _ = redteam(capsys, tmp_path, "--target", "text_models:keyword_moderator")
    hardened_code, hardened, err = redteam(capsys, tmp_path, "--target", "text_models:nfkc_keyword_moderator")
    # look-alikes of other scripts still get past NFKC: homoglyph_substitution fails, critical, for both
    assert bare_code == hardened_code == 1
    assert not attacks(hardened)["homoglyph_substitution"]["passed"]
    texts = attacks(bare)["whitespace_injection"]["details"]["attempts"]
    missed_plain = [t for t in library_texts("invisible_characters") if not text_models.keyword_moderator(t)]
    assert texts == len(library_texts("invisible_characters")) == 24 and len(missed_plain) == 12

    zw = attacks(hardened)["whitespace_injection"]
    assert zw["passed"] and zw["details"]["evasions"] == 0 and zw["details"]["attack_success_rate"] == 0.0
    assert zw["details"]["baseline_failures"] == len(missed_plain)
    assert sorted(f["original_text"] for f in zw["details"]["failures"]) == sorted(missed_plain)
    assert {(f["finding"], f["original_decision"]) for f in zw["details"]["failures"]} == {
        ("baseline_failure", "allow")}
    bare_zw = attacks(bare)["whitespace_injection"]["details"]
    assert not attacks(bare)["whitespace_injection"]["passed"]
    # every plain text the blocklist caught, a zero-width character inside its words gets past it
    assert (bare_zw["evasions"], bare_zw["baseline_failures"]) == (texts - len(missed_plain), len(missed_plain))
    assert bare_zw["attack_success_rate"] == bare_zw["evasions"] / (texts - bare_zw["baseline_failures"]) == 1.0
    assert {f["finding"] for f in bare_zw["failures"] if f["original_decision"] == "block"} == {"evasion"}

    for report in (bare, hardened):
        [baseline] = [r for r in report["results"] if r["test_name"] == "baseline_detection"]
        assert (baseline["passed"], baseline["severity"], baseline["category"]) == (False, "critical", "baseline")
        by_test = {name: r["details"]["baseline_failures"] for name, r in attacks(report).items()}
        assert baseline["details"]["by_test"] == {k: v for k, v in by_test.items() if v}
        assert baseline["details"]["baseline_failures"] == report["baseline_failures"] == sum(by_test.values()) > 0
        assert {m["text"] for m in baseline["details"]["missed"]} == set(missed_plain)
    # the same cases, the same plain misses; fewer evasions behind the hardening, none more on any case
    assert [r["details"]["baseline_failures"] for r in attacks(bare).values()] == [
        r["details"]["baseline_failures"] for r in attacks(hardened).values()]
    assert all(attacks(hardened)[name]["details"]["evasions"] <= r["details"]["evasions"]
               for name, r in attacks(bare).items())  # fmt: skip
    assert hardened["evasions"] < bare["evasions"]
    assert "whitespace_injection" not in err  # the summary lists failed tests only
    assert "FAIL critical baseline baseline_detection" in err


def library_texts(technique: str) -> list[str]:
    from exporter.gate.redteam.config import library_cases, load_library

    texts: list[str] = []
    for case in library_cases(load_library(), "classifier"):
        if case["technique"] == technique:
            texts += [t for t in case["texts"] if t not in texts]
    return texts


def test_junit_markdown_and_html_show_evasions_and_baseline_failures_apart(
        reports_bucket: S3, smtp: Mailbox, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = {kind: tmp_path / f"report.{kind}" for kind in ("xml", "md", "html")}
    code, report, _ = redteam(capsys, tmp_path, "--target", "text_models:nfkc_keyword_moderator",
                              "--junit", str(out["xml"]), "--summary-md", str(out["md"]), "--html", str(out["html"]))
    assert code == 1
    zw = attacks(report)["whitespace_injection"]["details"]

    cases = {c.get("name"): c for c in ET.parse(out["xml"]).iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["whitespace_injection"].iter("property")}
    assert (props["attempts"], props["baseline_failures"], props["evasions"], props["attack_success_rate"]) == (
        "24", str(zw["baseline_failures"]), "0", "0.0")
    [blocked] = cases["homoglyph_substitution"].iter("failure")
    assert blocked.get("message", "").startswith("critical failure, blocks: 12 evasion(s) in 12 attempt(s) whose "
                                                 "plain text was handled right")  # fmt: skip
    [missed] = cases["baseline_detection"].iter("failure")  # the seed's critical cases missed them: it blocks
    assert missed.get("message", "").startswith("critical failure, blocks: 36 of 72 attempts started from a plain "
                                                "text that already got the wrong outcome")  # fmt: skip

    rows = {line.split(" | ")[0].lstrip("| "): line for line in out["md"].read_text().splitlines()}
    assert rows["test"] == "| test | category | severity | attempts | baseline failures | evasions | " \
        "attack success rate | details | outcome |"  # fmt: skip
    assert rows["whitespace_injection"].startswith("| whitespace_injection | adversarial_evasion | critical | 24 | 12 "
                                                   "| 0 | 0.0000 | ")  # fmt: skip
    assert rows["whitespace_injection"].endswith("| ✅ pass |")
    assert rows["baseline_detection"].startswith("| baseline_detection | baseline | critical | 72 | 36 | — | — | ")

    page = out["html"].read_text()
    assert "24 evasion(s) and 36 baseline failure(s) in 144 attempts" in page
    section = page.split("<h3>whitespace_injection</h3>")[1].split("<h3>")[0]
    assert section.count("<td>baseline failure</td>") == zw["baseline_failures"] and "<td>evasion</td>" not in section
    assert "&lt;U+200B&gt;" in section  # the zero-width characters sent, made visible
