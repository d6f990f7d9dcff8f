"""Load a real prompt pool (the GPU profile's dataset) into :class:`dots.data.Question` rows.

Three sources, one column mapping (:class:`DatasetSpec`):

- ``parquet``: verl's layout, e.g. ``deepscaler.parquet`` (``prompt`` = chat messages,
  ``reward_model.ground_truth``, ``extra_info.{index, question, answer}``), read with pyarrow;
- ``jsonl``: one JSON object per line, with the same dotted mapping;
- ``datasets``: the Hugging Face ``datasets`` library: a ``save_to_disk`` folder, local data
  files, or a hub name (online only).

Why validate everything up front
--------------------------------
A bad row found at step 3,000 of a GPU run (an empty ground truth that every response "matches",
a numeric answer the reward cannot compare, a duplicate id that corrupts the embedding cache)
costs hours; found here it costs a second. So every row is checked *before* anything is returned
(and therefore before any model is loaded), and all problems are reported at once (the first 20,
with the total), each naming the file, the 0-based row, the id when known and the dotted column::

    deepscaler.parquet row 17 (id 17), column reward_model.ground_truth: empty string

Values are never coerced: a number where a string is expected is an error rather than a silent
``str(42)``, because it usually means the column mapping points at the wrong column.

Ground truths the reward cannot read
------------------------------------
A ground truth can be a valid string and still never be rewarded: a literal ``nan``/``None``/``null``
left by a careless export, or LaTeX that math-verify cannot parse (7 of DeepScaleR's 10,240, e.g.
``7\\sqrt{2}.``: only a verbatim copy of the text would ever score). Such a question is always
"unsolved", so it pollutes labels and selection. Null-like strings are refused always; given the
configured ``reward`` (:func:`load_pool`), every ground truth is also parsed as that reward parses it
(:func:`dots.rewards.unreadable_answers`: the math-verify worker pool, batched, each answer bounded
by the reward's timeout). The spec's ``unparseable`` decides what happens to those rows: ``refuse``
(the default) lists them in the error like any other bad row; ``drop`` drops them, prints how many and
their ids, and hands them back in the ``dropped`` list.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .config import DatasetFormat as Format, DatasetSpec  # noqa: F401  (re-exported)
from .data import Question, pool_hash
from .hub import offline
from .progress import say
from .rewards import DEFAULT_TIMEOUT_S, same_answers, unreadable_answers

MAX_REPORTED = 20
# Strings an export writes for a missing value (pandas, numpy, JSON, SQL, R): never a real ground truth.
NULL_LIKE = frozenset({"nan", "-nan", "+nan", "none", "null", "nil", "na", "n/a", "<na>", "nat", "undefined"})
_Problems = list[tuple[int, str]]  # (line or row, message), sorted into file order before reporting
_Read = tuple[dict[str, list], _Problems]  # {dotted column: values}, problems found while reading
_MISSING = object()


class DatasetError(ValueError):
    """A dataset cannot be read, or some of its rows are invalid. The message names file, row and column."""


# --------------------------------------------------------------------------------------
# reading: each source yields (row label extras, {column: [values]}) for the mapped columns
# --------------------------------------------------------------------------------------

def _walk(value: Any, parts: list[str]) -> Any:
    """Follow dotted parts through dicts (and integer indices through lists); _MISSING if absent."""
    for part in parts:
        if isinstance(value, dict):
            if part not in value:
                return _MISSING
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit():
            try:
                value = value[int(part)]
            except IndexError:
                return _MISSING
        else:
            return _MISSING
    return value


def _arrow_columns(table, columns: list[str], name: str,
                   all_columns: list[str] | None = None) -> dict[str, list]:
    """Python values of dotted columns of a pyarrow table; struct fields are extracted in arrow
    (so unused sibling fields are never converted), anything deeper is walked in Python."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out: dict[str, list] = {}
    for col in columns:
        parts = col.split(".")
        if parts[0] not in table.column_names:
            raise DatasetError(f"{name}: column {parts[0]!r} not found (for {col!r}); "
                               f"columns: {', '.join(all_columns or table.column_names)}")
        arr = table.column(parts[0])
        i = 1
        while i < len(parts) and pa.types.is_struct(arr.type):
            fields = [arr.type.field(k).name for k in range(arr.type.num_fields)]
            if parts[i] not in fields:
                raise DatasetError(f"{name}: column {'.'.join(parts[:i + 1])!r} not found (for {col!r}); "
                                   f"{'.'.join(parts[:i])} has fields: {', '.join(fields)}")
            arr = pc.struct_field(arr, [fields.index(parts[i])])
            i += 1
        values = arr.to_pylist()
        if i < len(parts):
            values = [_walk(v, parts[i:]) if v is not None else None for v in values]
        out[col] = values
    return out


def _read_parquet(spec: DatasetSpec, columns: list[str], name: str) -> _Read:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(spec.path)
    if not path.is_file():
        raise DatasetError(f"{spec.path}: no such parquet file")
    tops = sorted({c.split(".")[0] for c in columns})
    try:
        schema_names = pq.read_schema(path).names
        table = pq.read_table(path, columns=[t for t in tops if t in schema_names])
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{spec.path}: not a readable parquet file (truncated or corrupt?): "
                           f"{exc}") from None
    if spec.limit is not None:
        table = table.slice(0, spec.limit)
    return _arrow_columns(table, columns, name, schema_names), []


def _read_jsonl(spec: DatasetSpec, columns: list[str], name: str) -> _Read:
    """Rows are the non-blank lines (row r is the r-th non-blank line, 0-based); a line that is not
    UTF-8 or not a JSON object is a problem reported with its 1-based line number, and yields no row."""
    path = Path(spec.path)
    if not path.is_file():
        raise DatasetError(f"{spec.path}: no such JSONL file")
    values: dict[str, list] = {c: [] for c in columns}
    problems: _Problems = []
    lines: list[int] = []
    rows: list[int] = []
    row = -1
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            row += 1
            if spec.limit is not None and row >= spec.limit:
                break
            where = f"{name} line {lineno} (row {row})"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                byte = f"0x{raw[exc.start]:02x}"
                problems.append((lineno, f"{where}: not valid UTF-8 (byte {byte} at column {exc.start + 1})"))
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                problems.append((lineno, f"{where}: not valid JSON ({exc.msg} at column {exc.colno})"))
                continue
            if not isinstance(obj, dict):
                problems.append((lineno, f"{where}: expected a JSON object, got {type(obj).__name__}"))
                continue
            lines.append(lineno)
            rows.append(row)
            for c in columns:
                values[c].append(_walk(obj, c.split(".")))
    values["__line__"] = lines
    values["__row__"] = rows
    return values, problems


def _read_datasets(spec: DatasetSpec, columns: list[str], name: str) -> _Read:
    """A save_to_disk folder (load_from_disk), local data files (load_dataset("parquet"/"json")),
    a local folder of data files, or a hub name (load_dataset(name, split=...), online only)."""
    path = Path(spec.path)
    local = path.exists()
    if not local and offline("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        raise DatasetError(f"{spec.path}: not a local file or folder, and HF_HUB_OFFLINE=1 forbids "
                           f"downloading it from the Hugging Face Hub; download it first or give a "
                           f"local path")
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"{spec.path}: format 'datasets' needs the datasets package "
                           f"(pip install 'datasets>=3')") from None
    split = spec.split
    try:
        if path.is_dir() and ((path / "state.json").exists() or (path / "dataset_dict.json").exists()):
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DatasetError(f"{spec.path}: no split {split!r}; splits: {', '.join(ds)}")
                ds = ds[split]
        elif path.is_file():
            builder = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}.get(path.suffix.lower())
            if builder is None:
                raise DatasetError(f"{spec.path}: cannot tell the file type from the suffix "
                                   f"(expected .parquet, .jsonl or .json)")
            ds = datasets.load_dataset(builder, data_files=str(path), split="train")
        else:
            ds = datasets.load_dataset(spec.path, split=split)
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - datasets raises many types; name the path
        where = "local dataset" if local else "Hugging Face hub dataset"
        raise DatasetError(f"{spec.path}: could not load {where} (split {split!r}): "
                           f"{type(exc).__name__}: {exc}") from None
    if spec.limit is not None:
        ds = ds.select(range(min(spec.limit, len(ds))))
    table = ds.with_format("arrow")[:]
    return _arrow_columns(table, columns, name), []


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------

def _user_content(messages: list) -> tuple[Any, str | None]:
    """Content of the last user message of a chat-message list (verl's `prompt` column)."""
    if not all(isinstance(m, dict) for m in messages):
        return None, "expected a string or a list of chat messages {role, content}"
    users = [m for m in messages if m.get("role") == "user"]
    if not users:
        return None, "no user message in the chat messages"
    return users[-1].get("content", _MISSING), None


def _check_present(value: Any) -> str | None:
    """Why a value is absent (missing, None, NaN), or None when it is there."""
    if value is _MISSING:
        return "missing"
    if value is None:
        return "null (None)"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return None


def _check_text(value: Any, max_chars: int) -> str | None:
    """Why a question/answer value is unusable, or None."""
    absent = _check_present(value)
    if absent:
        return absent
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__} {value!r:.40}"
    if not value.strip():
        return "empty string"
    if len(value) > max_chars:
        return f"{len(value)} characters, more than max_chars={max_chars}"
    return None


def _check_id(value: Any) -> str | None:
    absent = _check_present(value)
    if absent:
        return absent
    if isinstance(value, bool) or not isinstance(value, int):
        return f"expected an integer id, got {type(value).__name__} {value!r:.40}"
    if value < 0:
        return f"id must be >= 0; got {value}"
    return None


def _null_like(answer: str) -> str | None:
    """Why a ground-truth string is a stand-in for a missing value, or None."""
    if answer.strip().lower() in NULL_LIKE:
        return "a null placeholder, not an answer"
    return None


def _shown(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return "'" + (text if len(text) <= width else text[: width - 1] + "…") + "'"


def _validate(spec: DatasetSpec, values: dict[str, list], problems: _Problems,
              name: str) -> tuple[list[Question], list[tuple[int, str, int]]]:
    """(the valid rows' questions, and for each its (sort key, row label, row number))."""
    lines = values.get("__line__")
    n = len(values[spec.question])
    row_numbers = values.get("__row__", range(n))
    ids = values[spec.id] if spec.id is not None else list(row_numbers)
    first_row: dict[int, int] = {}
    out: list[Question] = []
    places: list[tuple[int, str, int]] = []
    for k, row in enumerate(row_numbers):
        raw_id = ids[k]
        id_problem = _check_id(raw_id) if spec.id is not None else None
        where = [f"id {raw_id}"] if id_problem is None else []
        if lines is not None:
            where.append(f"line {lines[k]}")
        label = f"{name} row {row}" + (f" ({', '.join(where)})" if where else "")
        key = lines[k] if lines is not None else row
        bad = False
        if id_problem is not None:
            problems.append((key, f"{label}, column {spec.id}: {id_problem}"))
            bad = True
        elif raw_id in first_row:
            why = f"duplicate id {raw_id} (first at row {first_row[raw_id]})"
            problems.append((key, f"{label}, column {spec.id}: {why}"))
            bad = True
        else:
            first_row[raw_id] = row
        question, why = values[spec.question][k], None
        if isinstance(question, (list, tuple)):
            question, why = _user_content(list(question))
        why = why or _check_text(question, spec.max_chars)
        if why is not None:
            problems.append((key, f"{label}, column {spec.question}: {why}"))
            bad = True
        answer = values[spec.answer][k]
        why = _check_text(answer, spec.max_chars)
        if why is not None:
            problems.append((key, f"{label}, column {spec.answer}: {why}"))
            bad = True
        if not bad:
            out.append(Question(int(raw_id), question, answer))
            places.append((key, label, row))
    return out, places


def _unreadable(questions: list[Question], reward: str | None, timeout_s: float, name: str) -> dict[int, str]:
    """{index into questions: why its ground truth cannot be read}: null-like strings always, and what
    the reward's own parser cannot read when `reward` is given."""
    bad = {k: why for k, q in enumerate(questions) if (why := _null_like(q.answer))}
    if reward is None:
        return bad
    rest = [k for k in range(len(questions)) if k not in bad]
    answers = [questions[k].answer for k in rest]
    start = time.perf_counter()
    found = unreadable_answers(reward, answers, timeout_s)
    if reward != "exact_match":
        say(f"{name}: {len(answers)} ground truths ({len(set(answers))} distinct) checked with the {reward} "
            f"parser in {time.perf_counter() - start:.1f}s; {sum(w is not None for w in found)} unreadable")
    bad.update((k, why) for k, why in zip(rest, found) if why is not None)
    return dict(sorted(bad.items()))


def load_pool(spec: DatasetSpec | dict[str, Any] | str | os.PathLike, *, reward: str | None = None,
              timeout_s: float = DEFAULT_TIMEOUT_S, dropped: list[dict] | None = None) -> list[Question]:
    """Read and validate every row of a dataset; return its questions in file order.

    `spec` may be a :class:`DatasetSpec`, a dict of its fields, or just a path (default verl
    mapping). Raises :class:`DatasetError` naming file, row and column for any bad row.

    `reward` (a :data:`dots.rewards.REWARDS` name) also checks every ground truth with that reward's
    parser, each bounded by `timeout_s`; a null-like ground truth (``nan``, ``None``, ``null``, ...) is
    checked in any case. Such rows are refused, or with ``spec.unparseable == "drop"`` left out and,
    when `dropped` is given, appended to it as ``{"row", "id", "answer", "why"}``.
    """
    if isinstance(spec, (str, os.PathLike)):
        spec = {"path": os.fspath(spec)}
    if isinstance(spec, dict):
        try:
            spec = DatasetSpec.model_validate(spec)
        except ValidationError as exc:
            lines = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
            raise DatasetError("invalid dataset spec:\n  " + "\n  ".join(lines)) from None
    fmt = spec.resolved_format
    name = Path(spec.path).name if fmt != "datasets" or Path(spec.path).exists() else spec.path
    columns = list(dict.fromkeys(c for c in (spec.question, spec.answer, spec.id) if c is not None))
    reader = {"parquet": _read_parquet, "jsonl": _read_jsonl, "datasets": _read_datasets}[fmt]
    values, problems = reader(spec, columns, name)
    questions, places = _validate(spec, values, problems, name)
    # Rows already refused are reported first: a column mapping that points at the wrong column
    # (long solutions instead of answers) would otherwise spend minutes in the parser.
    unreadable = _unreadable(questions, None if problems else reward, timeout_s, name)
    refuse = spec.unparseable == "refuse"
    if refuse:
        problems += [(places[k][0], f"{places[k][1]}, column {spec.answer}: {_shown(questions[k].answer)}: {why}")
                     for k, why in unreadable.items()]
    if problems:
        problems.sort(key=lambda p: p[0])  # file order, whichever check found them
        shown = [message for _, message in problems[:MAX_REPORTED]]
        more = f" (first {MAX_REPORTED} shown)" if len(problems) > MAX_REPORTED else ""
        hint = ("\n(unparseable: drop drops rows whose ground truth the reward cannot read, and reports "
                "them: -S task.dataset.unparseable=drop for the training pool, unparseable: drop in an "
                "evaluate.sets entry, --unparseable drop for `dots evaluate --data`)"
                if refuse and unreadable else "")
        raise DatasetError(f"{spec.path}: {len(problems)} problem{'s' if len(problems) != 1 else ''}"
                           f"{more}:\n  " + "\n  ".join(shown) + hint)
    if unreadable:
        gone = [{"row": places[k][2], "id": questions[k].id, "answer": questions[k].answer, "why": why}
                for k, why in unreadable.items()]
        ids = shown_ids([g["id"] for g in gone], MAX_REPORTED)
        what = f"the {reward} reward cannot read" if reward else "is a null placeholder"
        say(f"{name}: dropped {len(gone)} row{'s' if len(gone) != 1 else ''} whose ground truth {what} "
            f"(unparseable: drop); ids {ids}")
        if dropped is not None:
            dropped.extend(gone)
        questions = [q for k, q in enumerate(questions) if k not in unreadable]
    if not questions:
        raise DatasetError(f"{spec.path}: no rows" + (" left after dropping the unreadable ones" if unreadable else ""))
    return questions


IDS_SHOWN = 10  # ids a one-line notice lists before "..."


def shown_ids(ids: list, limit: int = IDS_SHOWN) -> str:
    """The first `limit` ids, comma-separated, "..." after them when there are more."""
    return ", ".join(map(str, ids[:limit])) + (", ..." if len(ids) > limit else "")


# What two renderings of one question differ in, and nothing else: whitespace, the math delimiters
# ($...$ against \(...\) or \[...\]), LaTeX's spacing commands, \left and \right.
_RENDERING = re.compile(r"\s|\$|\\[()\[\]]|\\[,;:! ]|\\q?quad(?![a-zA-Z])|\\(?:left|right)(?![a-zA-Z])")
_FRACTION = re.compile(r"\\[dt]frac(?![a-zA-Z])")  # \dfrac and \tfrac: \frac set larger or smaller


def question_key(text: str) -> str:
    """A question's text without what two renderings of it may differ in (`_RENDERING`, and
    ``\\dfrac`` read as ``\\frac``): two rows with the same key ask the same question. Whitespace alone
    found 150 of DeepScaleR's repeats; this finds 170 (``$PQ=PR$`` against ``$PQ = PR$``, ``\\( n \\)``
    against ``$n$``), while ``$1,2$`` and ``$12$`` stay two questions."""
    return _RENDERING.sub("", _FRACTION.sub(r"\\frac", text))


def also_in(questions: Iterable[Question], pool: Iterable[Question]) -> list[int]:
    """Ids of the questions whose text (`question_key`) is also a pool question's."""
    seen = {question_key(q.prompt) for q in pool}
    return [q.id for q in questions if question_key(q.prompt) in seen]


def say_in_pool(name: str, questions: list[Question], pool: Iterable[Question]) -> list[int]:
    """`also_in`, said in one line when any: a held-out set made elsewhere (MATH500 beside a pool that
    holds MATH problems) can share questions with the training pool, and their scores are not held out."""
    ids = also_in(questions, pool)
    if ids:
        say(f"evaluate: {name}: {len(ids)} of {len(questions)} questions are also in the training pool "
            f"(ids {shown_ids(ids)}): their scores are not held out")
    return ids


def drop_repeats(questions: list[Question], reward: str,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[list[Question], list[dict], list[int]]:
    """The questions without the rows that repeat an earlier row's question (the same `question_key`),
    one ``{"id", "first_id", "conflict"}`` per row left out, and the ids of the first rows also left
    out because a repeat's ground truth conflicts with theirs.

    Why repeats go: the held-out set is split from the same rows as the pool, and a question in both
    is not held out (170 of DeepScaleR's 10,240 rows repeat an earlier row's question; 12 of the GPU
    profile's 512 held-out questions were in its pool). Why a conflicting question goes whole: when
    the reward called `reward` does not take two of its ground truths for one answer
    (:func:`dots.rewards.same_answers`; ``\\dfrac`` against ``\\frac`` is no conflict), no label of it can
    be trusted: DeepScaleR answers "the least positive integer with exactly 12 positive factors" with
    150, 60, 96, 72 and 108 in nine rows, and its first row says 150 (it is 60)."""
    first: dict[str, Question] = {}
    kept, repeated = [], []
    for q in questions:
        key = question_key(q.prompt)
        if key in first:
            repeated.append((first[key], q))
        else:
            first[key] = q
            kept.append(q)
    same = same_answers(reward, [(earlier.answer, q.answer) for earlier, q in repeated], timeout_s)
    repeats = [{"id": q.id, "first_id": earlier.id, "conflict": not agrees}
               for (earlier, q), agrees in zip(repeated, same)]
    gone = {r["first_id"] for r in repeats if r["conflict"]}
    return [q for q in kept if q.id not in gone], repeats, sorted(gone)


def say_repeats(name: str, questions: list[Question], reward: str,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, list[int]]:
    """A held-out set's repeated questions and those whose rows' ground truths conflict (`drop_repeats`),
    said in one line when any and returned for the results (``repeats``: the later rows' ids,
    ``conflicting``: the first rows'). The set is scored as its file has it, so that its score still
    compares with scores published on that file; but a repeat weighs its question twice, and a
    conflicting question scores every answer wrong against one of its labels."""
    _, repeats, conflicting = drop_repeats(questions, reward, timeout_s)
    named = (("repeats", [r["id"] for r in repeats]), ("conflicting", conflicting))
    found = {key: ids for key, ids in named if ids}
    if found:
        conflicts = (f"; {len(conflicting)} question{'s' if len(conflicting) != 1 else ''} whose rows give "
                     f"ground truths that {reward} does not take for one answer (first rows' ids "
                     f"{shown_ids(conflicting)})" if conflicting else "")
        rows = f"{len(repeats)} row{'s' if len(repeats) != 1 else ''} (ids {shown_ids(found['repeats'])})"
        say(f"evaluate: {name}: {rows} repeating an earlier row's question{conflicts}: "
            "scored as the file has them")
    return found


def dataset_version(questions: Iterable[Question]) -> str:
    """Content hash of a pool (ids, prompts, answers, in order): the `data_version` tag of a run, and
    what an embedding cache is valid for. Same as :func:`dots.data.pool_hash`, so the two never disagree."""
    return pool_hash(list(questions))
