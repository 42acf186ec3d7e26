"""The side table (exporter/core/side_table.py) against a dict of the same writes: the latest record wins, a
tombstone deletes, a correction applies from its time, through merges and a checkpoint round trip."""

from __future__ import annotations

import numpy as np

from exporter.core.side_table import SideTable, id_hashes


def test_the_table_answers_as_a_dict_of_the_latest_records_through_merges_and_restores() -> None:
    rng = np.random.default_rng(4)
    table = SideTable(["gender", "race"], max_records=10_000)
    truth: dict[str, tuple[str, str] | None] = {}
    ids = [f"id-{i}" if i % 3 else f"{i}" for i in range(3000)]  # lengths 1 to 7: several word counts
    hashes = dict(zip(ids, id_hashes(ids).tolist(), strict=True))
    for step in range(20):
        for _ in range(400):
            key = ids[int(rng.integers(len(ids)))]
            if rng.random() < 0.1:
                table.put(hashes[key], None)
                truth[key] = None
            else:
                value = (str(rng.choice(["male", "female"])), str(rng.choice(["white", "black", "asian"])))
                table.put(hashes[key], table.encode(dict(zip(table.fields, value, strict=True)), {}))
                truth[key] = value
        if step % 5 == 4:
            table.merge()
        if step == 10:
            restored = SideTable(table.fields, 10_000)
            restored.restore(table.state())
            table = restored
        asked = [ids[int(i)] for i in rng.integers(0, len(ids), 500)]
        found, codes, _ = table.get(id_hashes(asked))
        for key, hit, row in zip(asked, found.tolist(), codes.tolist(), strict=True):
            want = truth.get(key)
            assert hit == (want is not None), key
            if want is not None:
                assert tuple(table.values[k][c - 1] for k, c in enumerate(row)) == want
    assert len(table) == sum(v is not None for v in truth.values())


def test_a_correction_is_in_force_from_its_time_and_a_row_older_than_every_version_takes_the_first() -> None:
    table = SideTable(["gender"], 10)
    h = int(id_hashes(["a"])[0])
    table.put(h, table.encode({"gender": "male"}, {}), 100.0)
    table.put(h, table.encode({"gender": "female"}, {}), 200.0)
    hashes = np.array([h, h, h, h], dtype=np.uint64)
    found, codes, beyond = table.get(hashes, np.array([150.0, 250.0, 50.0, 10.0]), horizon=60.0)
    assert [table.values[0][c - 1] if f else None for f, c in zip(found, codes[:, 0], strict=True)] == [
        "male", "female", "male", None]
    assert beyond.tolist() == [False, False, False, True]  # the first version came 90 s after the row: too late
    table.forget_before(300.0)  # no prediction before 300 s is read any more: the replaced version goes
    assert table.previous == {}


def test_a_new_id_past_max_records_is_refused() -> None:
    table = SideTable(["gender"], 2)
    h = id_hashes(["a", "b", "c"]).tolist()
    assert table.put(h[0], (1,)) and table.put(h[1], (1,)) and not table.put(h[2], (1,))
    assert table.put(h[0], (2,))  # an id it holds may still change
