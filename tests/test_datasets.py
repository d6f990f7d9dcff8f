"""Loading real prompt pools: deepscaler parquet, the same rows as JSONL and as a `datasets` folder,
and every kind of bad row refused up front with file, row and column named."""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dots.data import Question
from dots.datasets import DatasetError, DatasetSpec, dataset_version, drop_repeats, load_pool, question_key

from .conftest import SHARED_DATA, require_shared

DEEPSCALER = SHARED_DATA / "deepscaler.parquet"


@pytest.fixture(scope="module")
def deepscaler() -> list[Question]:
    require_shared(DEEPSCALER)
    start = time.perf_counter()
    pool = load_pool(DatasetSpec(path=str(DEEPSCALER)))
    print(f"\nloaded {len(pool)} deepscaler rows in {time.perf_counter() - start:.2f}s")
    return pool


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    """The first 200 deepscaler rows as plain dicts (verl layout)."""
    require_shared(DEEPSCALER)
    import pyarrow.parquet as pq

    return pq.read_table(DEEPSCALER).slice(0, 200).to_pylist()


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_deepscaler_parquet(deepscaler):
    assert len(deepscaler) == 10240
    assert [q.id for q in deepscaler] == list(range(10240))
    assert all(q.prompt.strip() and q.answer.strip() for q in deepscaler)
    assert deepscaler[0].answer == "-\\frac{\\sqrt{3}}{3}"
    assert deepscaler[0].prompt.startswith("Calculate the limit of the function")
    assert all(q.tier == -1 for q in deepscaler)


def test_prompt_column_of_chat_messages_gives_the_user_turn(deepscaler):
    """verl's `prompt` column holds [system, user] messages; its user turn is the raw question."""
    via_messages = load_pool({"path": str(DEEPSCALER), "question": "prompt", "limit": 300})
    assert via_messages == deepscaler[:300]


def test_jsonl_and_datasets_folder_load_identically(rows, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    expected = load_pool({"path": str(DEEPSCALER), "limit": 200})
    assert len(expected) == 200

    jsonl = write_jsonl(tmp_path / "rows.jsonl", rows)
    assert load_pool({"path": str(jsonl)}) == expected  # format inferred from the suffix
    assert load_pool({"path": str(jsonl), "format": "jsonl", "question": "prompt"}) == expected

    folder = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))
    assert load_pool({"path": str(folder), "format": "datasets"}) == expected
    assert load_pool({"path": str(folder)}) == expected  # a folder: the datasets library
    # local data files through datasets.load_dataset
    assert load_pool({"path": str(jsonl), "format": "datasets"}) == expected
    parquet = write_parquet(tmp_path / "rows.parquet", rows)
    assert load_pool({"path": str(parquet), "format": "datasets"}) == expected
    assert load_pool({"path": str(parquet), "format": "datasets", "limit": 5}) == expected[:5]
    # a saved DatasetDict: the split is chosen by `split`
    full = datasets.Dataset.from_list(rows)
    splits = tmp_path / "splits"
    datasets.DatasetDict({"train": full, "test": full.select(range(10))}).save_to_disk(str(splits))
    assert load_pool({"path": str(splits), "split": "test"}) == expected[:10]
    with pytest.raises(DatasetError, match="no split 'validation'; splits: train, test"):
        load_pool({"path": str(splits), "split": "validation"})


def test_flat_jsonl_mapping_and_row_numbered_ids(tmp_path):
    path = write_jsonl(tmp_path / "flat.jsonl", [{"problem": "1+1?", "solution": "2"},
                                                  {"problem": "2+2?", "solution": "4"}])
    got = load_pool({"path": str(path), "question": "problem", "answer": "solution", "id": None})
    assert got == [Question(0, "1+1?", "2"), Question(1, "2+2?", "4")]


def _bad(rows: list[dict], row: int, changes: dict) -> list[dict]:
    """A copy of rows where row `row` has dotted keys changed (value `...` deletes the key)."""
    rows = json.loads(json.dumps(rows))
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = rows[row]
        for p in parents:
            node = node[p]
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return rows


GT, Q, ID = "reward_model.ground_truth", "extra_info.question", "extra_info.index"
BAD_ROWS = [
    ("missing field", {GT: ...}, f"column {GT}: missing"),
    ("empty string", {GT: "  "}, f"column {GT}: empty string"),
    ("wrong type", {GT: 42}, f"column {GT}: expected a string, got int 42"),
    ("None", {Q: None}, f"column {Q}: null"),
    ("NaN", {Q: math.nan}, f"column {Q}: NaN"),
    ("too long", {Q: "x" * 20001}, f"column {Q}: 20001 characters, more than max_chars=20000"),
    ("non-integer id", {ID: "17"}, f"column {ID}: expected an integer id"),
    ("missing id", {ID: ...}, f"column {ID}: missing"),
    ("'nan' string", {GT: "nan"}, f"column {GT}: 'nan': a null placeholder, not an answer"),
    ("'None' string", {GT: " None "}, f"column {GT}: 'None': a null placeholder, not an answer"),
]


@pytest.mark.parametrize("what,changes,message", BAD_ROWS, ids=[b[0] for b in BAD_ROWS])
def test_bad_jsonl_row_names_row_and_column(rows, tmp_path, what, changes, message):
    path = write_jsonl(tmp_path / "bad.jsonl", _bad(rows, 17, changes))
    with pytest.raises(DatasetError) as err:
        load_pool({"path": str(path)})
    text = str(err.value)
    assert "bad.jsonl row 17" in text and "line 18" in text and message in text, text
    assert "1 problem" in text


PARQUET_BAD = [
    ("empty string", "reward_model.ground_truth", "  ", "empty string"),
    ("None", "extra_info.question", None, "null (None)"),
    ("too long", "extra_info.question", "x" * 20001, "20001 characters, more than max_chars=20000"),
    # parquet columns are typed: the wrong type / NaN cases make the whole column numeric
    ("wrong type", "reward_model.ground_truth", 42, "expected a string, got int 42"),
    ("NaN", "reward_model.ground_truth", math.nan, "NaN"),
    # a corrupted copy: the value survived an export as the string "nan"
    ("'nan' string", "reward_model.ground_truth", "nan", "'nan': a null placeholder, not an answer"),
]


@pytest.mark.parametrize("what,column,value,message", PARQUET_BAD, ids=[b[0] for b in PARQUET_BAD])
def test_bad_parquet_row_names_row_id_and_column(rows, tmp_path, what, column, value, message):
    bad = json.loads(json.dumps(rows))
    top, field = column.split(".")
    if isinstance(value, (int, float)):
        for i, r in enumerate(bad):
            r[top][field] = float(i) if isinstance(value, float) else i
    bad[17][top][field] = value
    path = write_parquet(tmp_path / "bad.parquet", bad)
    with pytest.raises(DatasetError) as err:
        load_pool({"path": str(path)})
    assert f"bad.parquet row 17 (id 17), column {column}: {message}" in str(err.value), str(err.value)


def test_duplicate_and_many_problems_reported_together(rows, tmp_path):
    bad = json.loads(json.dumps(rows))
    bad[5]["extra_info"]["index"] = 3
    for i in range(30, 60):
        bad[i]["reward_model"]["ground_truth"] = ""
    path = write_parquet(tmp_path / "many.parquet", bad)
    with pytest.raises(DatasetError) as err:
        load_pool({"path": str(path)})
    text = str(err.value)
    assert "31 problems (first 20 shown)" in text
    assert "many.parquet row 5 (id 3), column extra_info.index: duplicate id 3 (first at row 3)" in text
    assert "many.parquet row 30 (id 30), column reward_model.ground_truth: empty string" in text
    assert "row 59" not in text  # beyond the first 20


def test_missing_parquet_column_named(rows, tmp_path):
    path = write_parquet(tmp_path / "cols.parquet", rows)
    with pytest.raises(DatasetError, match="column .solution. not found.*columns: data_source, prompt"):
        load_pool({"path": str(path), "answer": "solution"})
    with pytest.raises(DatasetError, match="column 'reward_model.truth' not found.*ground_truth, style"):
        load_pool({"path": str(path), "answer": "reward_model.truth"})


def test_non_utf8_and_invalid_json_lines(rows, tmp_path):
    path = tmp_path / "enc.jsonl"
    lines = [json.dumps(r).encode() for r in rows[:10]]
    lines[3] = lines[3][:20] + b"\xff" + lines[3][20:]  # inside the data_source string
    lines[6] = b'{"not": json'
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DatasetError) as err:
        load_pool({"path": str(path)})
    text = str(err.value)
    assert "enc.jsonl line 4 (row 3): not valid UTF-8" in text, text
    assert "enc.jsonl line 7 (row 6): not valid JSON" in text, text


def test_truncated_parquet_is_a_clear_error(tmp_path):
    data = require_shared(DEEPSCALER).read_bytes()
    path = tmp_path / "truncated.parquet"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match="truncated.parquet: not a readable parquet file"):
        load_pool({"path": str(path)})
    with pytest.raises(DatasetError, match="no such parquet file"):
        load_pool({"path": str(tmp_path / "absent.parquet")})


def test_hub_name_offline_is_a_clear_error():
    import os

    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # set by conftest
    with pytest.raises(DatasetError, match="agentica-org/DeepScaleR-Preview-Dataset: not a local file or "
                                           "folder, and HF_HUB_OFFLINE=1"):
        load_pool({"path": "agentica-org/DeepScaleR-Preview-Dataset", "format": "datasets"})


def test_bad_spec_refused():
    with pytest.raises(DatasetError, match="format"):
        load_pool({"path": "x.parquet", "format": "csv"})
    with pytest.raises(DatasetError, match="max_chars"):
        load_pool({"path": "x.parquet", "max_chars": 0})


def test_dataset_version_tracks_content(deepscaler):
    version = dataset_version(deepscaler)
    assert version == dataset_version(list(deepscaler))
    changed = list(deepscaler)
    changed[123] = replace(changed[123], answer=changed[123].answer + "0")
    assert dataset_version(changed) != version
    assert dataset_version(deepscaler[:-1]) != version


# ---- ground truths the reward cannot read ----------------------------------------------------------

UNPARSEABLE = {2: "7\\sqrt{2}.", 4: "-446.\\overline{2}"}  # two of DeepScaleR's own (rows 6784 and 3574)


def _answers_file(tmp_path: Path, answers: list[str]) -> dict:
    rows = [{"qid": 100 + i, "q": f"question {i}?", "a": a} for i, a in enumerate(answers)]
    path = write_jsonl(tmp_path / "answers.jsonl", rows)
    return {"path": str(path), "question": "q", "answer": "a", "id": "qid"}


@pytest.mark.parametrize("null", ["nan", "NaN", "-nan", "None", "null", " NULL ", "n/a", "<NA>", "undefined"])
def test_null_like_ground_truths_are_refused_whatever_the_reward(tmp_path, null):
    spec = _answers_file(tmp_path, ["1", "2", "3", null, "5"])
    for reward in (None, "exact_match"):
        with pytest.raises(DatasetError) as err:
            load_pool(spec, reward=reward)
        text = str(err.value)
        assert "1 problem:" in text, text
        assert f"answers.jsonl row 3 (id 103, line 4), column a: '{null.strip()}': a null placeholder" in text, text
        assert "unparseable: drop" in text  # the error names the way out
    assert [q.id for q in load_pool(_answers_file(tmp_path, ["1", "none of them", "nano"]))] == [100, 101, 102]


def test_unparseable_latex_ground_truth_is_refused_with_its_row_named(tmp_path):
    answers = ["1", "\\frac{1}{2}", UNPARSEABLE[2], "x^2+1", UNPARSEABLE[4], "\\sqrt{2}"]
    spec = _answers_file(tmp_path, answers)
    assert len(load_pool(spec)) == 6  # without a reward only the text itself is checked
    with pytest.raises(DatasetError) as err:
        load_pool(spec, reward="math_verify")
    text = str(err.value)
    assert text.startswith(f"{spec['path']}: 2 problems:"), text
    for row, answer in UNPARSEABLE.items():
        assert (f"answers.jsonl row {row} (id {100 + row}, line {row + 1}), column a: '{answer}': "
                f"math-verify cannot parse it") in text, text
    assert "row 0 " not in text and "row 1 " not in text and "row 3 " not in text and "row 5 " not in text


def test_drop_mode_drops_exactly_the_unreadable_rows_and_reports_them(tmp_path, capsys):
    answers = ["1", "\\frac{1}{2}", UNPARSEABLE[2], "nan", UNPARSEABLE[4], "\\sqrt{2}"]
    spec = {**_answers_file(tmp_path, answers), "unparseable": "drop"}
    dropped: list[dict] = []
    got = load_pool(spec, reward="math_verify", dropped=dropped)
    assert [q.id for q in got] == [100, 101, 105]
    assert [q.answer for q in got] == ["1", "\\frac{1}{2}", "\\sqrt{2}"]
    assert [(d["row"], d["id"], d["answer"]) for d in dropped] == [
        (2, 102, UNPARSEABLE[2]), (3, 103, "nan"), (4, 104, UNPARSEABLE[4])]
    assert "math-verify cannot parse it" in dropped[0]["why"] and "null placeholder" in dropped[1]["why"]
    out = capsys.readouterr().out
    assert "answers.jsonl: dropped 3 rows whose ground truth the math_verify reward cannot read" in out, out
    assert "ids 102, 103, 104" in out, out
    # other bad rows are still refused in drop mode: dropping is only for unreadable ground truths
    bad = write_jsonl(tmp_path / "answers.jsonl", [{"qid": 1, "q": "", "a": "nan"}, {"qid": 2, "q": "?", "a": "2"}])
    with pytest.raises(DatasetError, match="row 0 .*column q: empty string"):
        load_pool({**spec, "path": str(bad)}, reward="math_verify")
    # nothing readable left: an error, not an empty pool
    write_jsonl(tmp_path / "answers.jsonl", [{"qid": 1, "q": "?", "a": "nan"}])
    with pytest.raises(DatasetError, match="no rows left after dropping"):
        load_pool(spec, reward="math_verify")


def test_exact_match_refuses_a_ground_truth_it_can_never_match(tmp_path):
    """exact_match strips all whitespace from a response, so an answer holding whitespace never matches."""
    spec = _answers_file(tmp_path, ["12", "1 2", "3"])
    assert len(load_pool(spec, reward="math_verify")) == 3  # math-verify reads "1 2" (as 12)
    with pytest.raises(DatasetError, match="row 1 .*column a: '1 2': holds whitespace"):
        load_pool(spec, reward="exact_match")


def test_the_prepare_stage_checks_with_the_configured_reward_and_reports_drops(tmp_path):
    """dots prepare reads the reward from the config; refuse writes nothing, drop lists the ids in the
    stage's info. No model is involved: the check runs before any model could load."""
    from dots import stages
    from dots.config import load_config

    from .test_cli import SMALL

    answers = [f"\\frac{{{i}}}{{{i + 1}}}" for i in range(200)]
    answers[7], answers[150] = UNPARSEABLE[2], "null"
    spec = _answers_file(tmp_path, answers)

    def prepare(mode: str, reward: str = "math_verify"):
        cfg = load_config(None, SMALL + [f"paths.root={tmp_path / mode / 'artifacts'}", "task.source=dataset",
                                         f"task.dataset={json.dumps({**spec, 'unparseable': mode})}",
                                         "task.eval_size=32", f"reward.name={reward}"])
        return cfg, stages.prepare(cfg)

    with pytest.raises(DatasetError) as err:
        prepare("refuse")
    assert "row 7 (id 107, line 8)" in str(err.value) and "row 150 (id 250, line 151)" in str(err.value)
    assert not (tmp_path / "refuse").exists()  # nothing written
    cfg, info = prepare("drop")
    why = info["dropped"].pop("why")  # each row's reason, as the error above named it
    assert len(why) == 2 and all(reason and reason in str(err.value) for reason in why), why
    assert info == {"pool": 166, "eval": 32, "dropped": {"rows": 2, "ids": [107, 250]}}
    pool, held = stages.load_data(cfg)
    assert {q.id for q in pool + held}.isdisjoint({107, 250}) and len(pool + held) == 198


def test_a_question_repeated_in_the_file_is_never_both_held_out_and_in_the_pool(tmp_path, capsys):
    """Rows that repeat an earlier row's question (`question_key`) are left out before the split, named
    on a line and in the stage's info: without that, a seed that puts one copy in the held-out set and
    the other in the pool tests the policy on a question it trained on. A question whose rows give
    answers the reward does not take for one (5 against 55) leaves whole, its first row too: which of
    its labels is right cannot be known, and keeping the first trained on a wrong one."""
    from dots import stages
    from dots.config import load_config

    from .test_cli import SMALL

    rows = [{"qid": 100 + i, "q": f"question {i}?", "a": str(i)} for i in range(200)]
    for k, (src, text, answer) in enumerate([(3, "question  3?", "3"), (5, " question 5? ", "55"),
                                             (3, "question 3?", "3")]):
        rows[40 + 50 * k] = {"qid": rows[40 + 50 * k]["qid"], "q": text, "a": answer}
    path = write_jsonl(tmp_path / "repeats.jsonl", rows)
    spec = {"path": str(path), "question": "q", "answer": "a", "id": "qid"}
    kept, repeats, conflicting = drop_repeats(load_pool(spec), "exact_match")
    assert repeats == [{"id": 140, "first_id": 103, "conflict": False},
                       {"id": 190, "first_id": 105, "conflict": True},
                       {"id": 240, "first_id": 103, "conflict": False}]
    assert conflicting == [105]
    kept_ids = {q.id for q in kept}
    assert len(kept) == 196 and kept_ids.isdisjoint({105, 140, 190, 240}) and 103 in kept_ids
    cfg = load_config(None, SMALL + [f"paths.root={tmp_path / 'artifacts'}", "task.source=dataset",
                                     f"task.dataset={json.dumps(spec)}", "task.eval_size=32"])
    info = stages.prepare(cfg)
    assert info["repeats"] == {"rows": 3, "ids": [140, 190, 240], "first_ids": [103, 105, 103],
                               "conflicting": [190]}
    assert info["conflicting"] == {"questions": 1, "ids": [105]}
    assert info["pool"] + info["eval"] == 196
    prepared = tmp_path / "artifacts" / "data" / "prepare.json"
    assert json.loads(prepared.read_text()) == info  # every id, where the printed lines stop at ten
    out = capsys.readouterr().out
    assert f"prepare: every row left out, and why: {prepared}" in out
    assert "dropped 3 rows repeating an earlier row's question (ids 140, 190, 240)" in out
    assert "dropped 1 question whose rows give ground truths that exact_match does not take for one answer " \
           "(first rows' ids 105)" in out
    pool, held = stages.load_data(cfg)
    assert {" ".join(q.prompt.split()) for q in pool}.isdisjoint(" ".join(q.prompt.split()) for q in held)
    assert {q.id for q in pool + held}.isdisjoint({105, 140, 190, 240})


def test_two_renderings_of_one_question_are_one_question():
    """DeepScaleR writes some questions twice with other spacing or delimiters (``$PQ=PR$`` against
    ``$PQ = PR$``, ``\\( n \\)`` against ``$n$``: 20 rows beyond the 150 that whitespace alone finds);
    they are one question, and a question that says something else stays another."""
    same = [("Let $PQ=PR$.", "Let $PQ = PR$ ."), ("Find \\( n^{4} \\)", "Find $n^{4}$"),
            ("$\\dfrac{1}{2}$", "\\[\\frac{1}{2}\\]"), ("$\\left( x \\right)$", "$(x)$"), ("a\\,b", "a b"),
            ("$a\\quad b$", "$a\nb$")]
    differ = [("$2+3$", "$2*3$"), ("Find $x$.", "Find $y$."), ("$1,2$", "$12$"), ("$\\leftarrow$", "$arrow$"),
              ("$\\quadrilateral$", "$rilateral$"), ("What is $x$?", "what is $x$?")]
    assert [question_key(a) == question_key(b) for a, b in same] == [True] * len(same)
    assert [question_key(a) == question_key(b) for a, b in differ] == [False] * len(differ)


def test_a_repeat_written_otherwise_is_no_conflict_under_math_verify():
    """Under math_verify, ``\\dfrac{1}{2}`` and ``0.5`` are one answer: such a question keeps its first
    row (DeepScaleR writes many answers both ways); 150 against 60 is a conflict."""
    rows = [("half?", "\\dfrac{1}{2}"), ("divisors?", "150"), ("half? ", "0.5"), ("divisors?", "60"),
            ("other?", "7")]
    questions = [Question(i, p, a) for i, (p, a) in enumerate(rows)]
    kept, repeats, conflicting = drop_repeats(questions, "math_verify")
    assert [q.id for q in kept] == [0, 4] and conflicting == [1]
    assert repeats == [{"id": 2, "first_id": 0, "conflict": False},
                       {"id": 3, "first_id": 1, "conflict": True}]


def test_deepscaler_ground_truths_math_verify_cannot_parse(capsys):
    """The whole DeepScaleR file through the math_verify check: 7 of 10,240 ground truths do not parse
    (math-verify 0.9), each named; the 3,760 distinct answers parse in a few seconds on two workers."""
    require_shared(DEEPSCALER)
    start = time.perf_counter()
    with pytest.raises(DatasetError) as err:
        load_pool(DatasetSpec(path=str(DEEPSCALER)), reward="math_verify")
    elapsed = time.perf_counter() - start
    text = str(err.value)
    rows = [int(r) for r in re.findall(r"deepscaler.parquet row (\d+) \(id \1\), column reward_model.ground_truth: "
                                       r".*math-verify cannot parse it", text)]
    print(f"\n{len(rows)} unparseable deepscaler ground truths {rows}; load and check took {elapsed:.1f}s")
    assert text.startswith(f"{DEEPSCALER}: 7 problems:"), text
    assert rows == [2586, 2736, 3574, 6784, 7235, 9006, 9051], text
    assert "'7\\sqrt{2}.'" in text and "'3\\mid n'" in text
    assert "10240 ground truths (3760 distinct) checked with the math_verify parser" in capsys.readouterr().out
