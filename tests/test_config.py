"""The one validated config loader: bad values are refused early with the key named."""

from __future__ import annotations

import pytest
import yaml

from dots.cli import main
from dots.config import METHODS, Config, ConfigError, Tier, flatten, load_config

from .conftest import REPO, refused


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2"])
def test_replay_delta_out_of_range(value):
    refused([f"replay.delta={value}"], "replay.delta", "(0, 1]")


@pytest.mark.parametrize("value", ["0", "-1"])
def test_selection_tau_must_be_positive(value):
    refused([f"selection.tau={value}"], "selection.tau", "(0, inf)")


@pytest.mark.parametrize("key", ["task.seed", "train.seed", "eval.seed", "evaluate.seed"])
def test_a_negative_seed_is_refused_naming_its_key(key):
    """numpy's own error ("expected non-negative integer") named no key, and came after the warm-up."""
    refused([f"{key}=-1"], key, "[0, 4611686018427387904]")


def test_group_size_of_onerefused():
    refused(["rollout.group_size=1"], "rollout.group_size", "[2, inf)")


def test_ref_size_larger_than_poolrefused():
    refused(["task.pool_size=1024", "label.num_questions=128", "predictor.batch_size=64",
              "train.batch_size=16", "selection.ref_size=2048"], "selection.ref_size", "task.pool_size")


def test_one_reference_is_refused():
    # the predictor's training masks a query out of its own references: with one, none was left (NaN)
    refused(["selection.ref_size=1"], "selection.ref_size", "2")


def test_ref_size_plus_round_must_fit_the_pool():
    # each fits alone, but a round needs ref_size + every x batch_size distinct questions
    refused(["task.pool_size=1024", "label.num_questions=128", "predictor.batch_size=64",
              "train.batch_size=400", "selection.every=2", "selection.ref_size=300"], "selection.ref_size")


@pytest.mark.parametrize("fraction", ["0.75", "0.05"])
def test_a_predictor_split_too_small_on_either_side_is_refused(fraction):
    """8 questions at 0.75 left 2 to train on: K = 1, every prediction that one label, a NaN
    Pearson after the labelling pass; at 0.05 one question was held out, a Pearson of one."""
    refused(["label.num_questions=8", "predictor.batch_size=8", f"predictor.holdout_fraction={fraction}"],
            "predictor.holdout_fraction", "label.num_questions (8)")


def test_unknown_methodrefused():
    refused(["train.method=ppo"], "train.method", "ppo")


def test_unknown_methods_entryrefused():
    refused(["train.methods=[grpo, ppo]"], "train.methods")


@pytest.mark.parametrize("key", ["train.bogus", "bogus.key", "replay.deltaa"])
def test_unknown_keyrefused(key):
    refused([f"{key}=1"], key.split(".")[0] if key.startswith("bogus") else key, "unknown key")


def test_n_head_must_divide_n_embd():
    refused(["model.n_head=3", "model.n_embd=64"], "model.n_head", "n_embd")


def test_label_policy_must_name_a_checkpoint():
    refused(["warmup.checkpoints=[200]", "label.policies=[step200, step800]"], "label.policies", "step800")


def test_checkpoint_at_final_or_not_positive_refused():
    refused(["warmup.steps=100", "warmup.checkpoints=[100]", "label.policies=[final]"], "warmup.checkpoints")
    refused(["warmup.steps=100", "warmup.checkpoints=[0]", "label.policies=[final]"], "warmup.checkpoints")


def test_override_without_equalsrefused():
    refused(["train.steps"], "train.steps", "key=value")


def test_override_into_a_valuerefused():
    with pytest.raises(ConfigError, match="train"):
        load_config(None, {"train": 5, "train.steps": 3})


def test_bad_type_names_key():
    refused(["train.steps=many"], "train.steps")


def test_valid_overrides_parse_types():
    cfg = load_config(None, ["train.target_accuracy=0.6", "train.steps=50", "train.method=grpo",
                             "train.methods=[grpo, rr]", "task.tiers=[{operands: 2, digits: 1}]",
                             "selection.tau=1e-3", "loss.scale_rewards=group"])
    assert isinstance(cfg.train.target_accuracy, float) and cfg.train.target_accuracy == 0.6
    assert isinstance(cfg.train.steps, int) and cfg.train.steps == 50
    assert cfg.train.method == "grpo"
    assert cfg.train.methods == ["grpo", "rr"]
    assert cfg.task.tiers == [Tier(operands=2, digits=1)]
    assert cfg.selection.tau == pytest.approx(1e-3)
    assert cfg.loss.scale_rewards == "group"
    assert load_config(None, ["train.target_accuracy=null"]).train.target_accuracy is None


def test_dict_overrides_equal_string_overrides():
    a = load_config(None, ["train.steps=7", "replay.delta=0.25"])
    b = load_config(None, {"train.steps": 7, "replay.delta": 0.25})
    assert a == b
    assert a.flat()["replay.delta"] == 0.25


def test_params_yaml_loads_and_every_key_is_honoured():
    path = REPO / "params.yaml"
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    raw = flatten(yaml.safe_load(path.read_text()))
    flat = cfg.flat()
    for key, value in raw.items():
        if key == "task.tiers":
            assert [t.model_dump(exclude={"weight"}) for t in cfg.task.tiers] == value
        else:
            assert flat[key] == value, key


def test_params_yaml_with_overrides(tmp_path):
    cfg = load_config(REPO / "params.yaml", ["train.steps=12", f"paths.root={tmp_path}"])
    assert cfg.train.steps == 12
    assert cfg.root == tmp_path


def test_invalid_yaml_filerefused(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="params.yaml"):
        load_config(bad)


def test_cli_refuses_bad_value_before_any_work(tmp_path, capsys):
    root = tmp_path / "artifacts"
    code = main(["prepare", "-p", str(REPO / "params.yaml"), "-S", f"paths.root={root}", "-S", "replay.delta=1.5"])
    assert code == 2
    err = capsys.readouterr().err
    assert "replay.delta" in err and "(0, 1]" in err
    assert not root.exists()


@pytest.mark.parametrize("flag, value, said", [
    ("--seed", "-1", "must be in [0, 4611686018427387904]; got -1"),
    ("--samples", "-8", "must be >= 0; got -8"),
    ("--limit", "0", "must be >= 1; got 0"),
    ("--seed", "x", "expected an integer, got 'x'")])
def test_evaluate_refuses_a_bad_seed_samples_or_limit_naming_the_argument(tmp_path, capsys, flag, value,
                                                                          said):
    """`dots evaluate --data` took any --seed (torch ran a negative one) and a negative --samples
    silently meant greedy only; argparse now refuses them, naming the argument, before any work."""
    root = tmp_path / "artifacts"
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "-p", str(REPO / "params.yaml"), "-S", f"paths.root={root}",
              "--data", str(tmp_path / "set.jsonl"), flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}: {said}" in capsys.readouterr().err
    assert not root.exists()


def test_evaluate_refuses_an_out_it_cannot_write_before_loading_anything(tmp_path, capsys):
    """`--out` was written only after the whole evaluation (minutes on a GPU); a folder in its
    place, or a file where its folder should be, is now refused first: the missing --data file
    is never reached."""
    taken = tmp_path / "taken"
    taken.write_text("keep")
    base = ["evaluate", "-p", str(REPO / "params.yaml"), "-S", f"paths.root={tmp_path / 'artifacts'}",
            "--data", str(tmp_path / "missing.jsonl")]
    assert main(base + ["--out", str(tmp_path)]) == 1
    assert f"--out {tmp_path}: is a folder; give the JSON file's path" in capsys.readouterr().err
    assert main(base + ["--out", str(taken / "result.json")]) == 1
    err = capsys.readouterr().err
    assert f"--out {taken / 'result.json'}: cannot write there" in err and "missing.jsonl" not in err
    assert taken.read_text() == "keep"
    assert main(base + ["--out", str(tmp_path / "new" / "result.json")]) == 1  # writable: on to --data
    assert "missing.jsonl" in capsys.readouterr().err and (tmp_path / "new").is_dir()


def test_a_params_file_named_but_missing_is_refused_not_read_as_the_defaults(tmp_path, capsys, monkeypatch):
    """`dots all -p configs/profile.yml` (a typo of .yaml) trained the embedded default in the
    profile's place, over the default paths.root: a missing path read as every default. A file
    named (-p, the bench flow's `params`) must now exist; with none named, ./params.yaml is read
    when there is one, and every default when not."""
    from dots.config import params_file

    monkeypatch.chdir(tmp_path)
    code = main(["prepare", "-p", "configs/profile.yml", "-S", f"paths.root={tmp_path / 'artifacts'}"])
    assert code == 2
    assert "configs/profile.yml: no such params file" in capsys.readouterr().err
    assert not (tmp_path / "artifacts").exists()
    with pytest.raises(ConfigError, match="profile.yml: no such params file"):
        params_file("configs/profile.yml")
    assert params_file(None) is None  # no ./params.yaml here: every default
    (tmp_path / "params.yaml").write_text("train:\n  steps: 7\n")
    assert params_file(None) == "params.yaml"
    assert load_config(params_file(None)).train.steps == 7
    assert params_file(str(REPO / "params.yaml")) == str(REPO / "params.yaml")


def test_cli_refuses_unknown_key_for_train(tmp_path, capsys):
    root = tmp_path / "artifacts"
    code = main(["train", "--method", "grpo", "-p", str(REPO / "params.yaml"), "-S", f"paths.root={root}",
                 "-S", "train.bogus=3"])
    assert code == 2
    assert "train.bogus" in capsys.readouterr().err
    assert not root.exists()


def test_choosing_vllm_without_the_gpu_extra_is_a_clear_error():
    """The vLLM engine is an optional extra, imported only when chosen."""
    import importlib.util

    from dots.models import build_model, build_tokenizer
    from dots.engines import make_engine

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    tok = build_tokenizer()
    model = build_model(load_config(None).model, tok)
    with pytest.raises(ValueError, match=r"dots\[gpu\]"):
        make_engine("vllm", model, tok, 8)


def test_each_method_trains_at_its_own_rate_unless_train_lr_sets_every_one():
    """train.lr null: each method's rate from train.lr_by_method; a number overrides them all,
    so `-S train.lr=0.0003` (or `dvc exp run -S train.lr=...`) is the old one-rate bench."""
    cfg = load_config(REPO / "params.yaml")
    assert cfg.train.lr is None
    assert {m: cfg.train.rate_for(m) for m in ("grpo", "rr", "dots_rr", "greso")} == \
        {"grpo": 3e-4, "rr": 3e-4, "dots_rr": 6e-4, "greso": 6e-4}
    one = load_config(REPO / "params.yaml", ["train.lr=0.001"])
    assert {one.train.rate_for(m) for m in ("grpo", "dots", "rr", "dots_rr", "dapo", "greso")} == {0.001}
    assert load_config(None, ["train.lr_by_method.grpo=0.002"]).train.rate_for("grpo") == 0.002


def test_a_rate_per_method_is_checked_and_named():
    refused(["train.lr_by_method.dots_rr=1.5"], "train.lr_by_method: rates must be in (0, 1)")
    refused(["train.lr_by_method.ppo=0.1"], "train.lr_by_method.ppo")
    # a method the map does not name keeps its measured rate
    partial = load_config(None, ["train.lr_by_method={grpo: 0.0001}"]).train
    assert (partial.rate_for("grpo"), partial.rate_for("greso")) == (0.0001, 6e-4)


def test_each_replaying_method_has_its_own_fresh_share_unless_replay_delta_sets_every_one():
    """replay.delta null: dots_rr replays 40 of 64 groups (0.375 fresh), rr the paper's half; a
    number sets every method's share (`-S replay.delta=0.5` is the paper's dots_rr again); a share
    out of range or a method that does not exist is refused by name; another method's share
    leaves a run's key alone."""
    cfg = load_config(REPO / "params.yaml")
    assert cfg.replay.delta is None
    assert {m: cfg.replay.delta_for(m) for m in ("rr", "dots_rr", "greso_rr", "grpo")} == \
        {"rr": 0.5, "dots_rr": 0.375, "greso_rr": 0.5, "grpo": 0.5}
    one = load_config(REPO / "params.yaml", ["replay.delta=0.25"]).replay
    assert {one.delta_for(m) for m in ("rr", "dots_rr", "greso_rr")} == {0.25}
    rr = load_config(None, ["replay.delta_by_method.rr=0.25"]).replay
    assert (rr.delta_for("rr"), rr.delta_for("dots_rr")) == (0.25, 0.375)
    refused(["replay.delta_by_method.dots_rr=1.5"], "replay.delta_by_method: each share must be in (0, 1]")
    refused(["replay.delta_by_method.ppo=0.5"], "replay.delta_by_method.ppo")
    base = Config()
    other = load_config(None, ["replay.delta_by_method.rr=0.25"])
    assert base.fingerprint(method="dots_rr") == other.fingerprint(method="dots_rr")
    assert base.fingerprint(method="rr") != other.fingerprint(method="rr")
    assert base.fingerprint(method="dots_rr") == load_config(None, ["replay.delta=0.375"]).fingerprint(method="dots_rr")


def test_a_runs_fingerprint_holds_its_own_rate_not_the_other_methods():
    """Changing greso's rate leaves a dots_rr run's key (and its checkpoints) valid; changing its own does not."""
    base = Config()
    other = load_config(None, ["train.lr_by_method.greso=0.0001"])
    assert base.fingerprint(method="dots_rr") == other.fingerprint(method="dots_rr")
    assert base.fingerprint(method="greso") != other.fingerprint(method="greso")
    assert base.fingerprint(method="dots_rr") == load_config(None, ["train.lr=0.0006"]).fingerprint(method="dots_rr")


def test_a_runs_fingerprint_leaves_out_the_sections_its_method_never_reads():
    """A selection, replay or peer param cannot change a grpo run: its key (and so its checkpoint)
    stays valid, so `dvc exp run -S selection.tau=...` does not train grpo again; a method that reads
    the section gets a new key."""
    base = Config()
    readers = {"selection.tau=0.3": {"dots", "dots_rr"}, "replay.capacity=64": {"rr", "dots_rr", "greso_rr"},
               "greso.p_min=0.1": {"greso", "greso_rr"}, "dapo.max_gen_batches=3": {"dapo"},
               "predictor.steps=300": {"dots", "dots_rr"}}
    for change, methods in readers.items():
        other = load_config(None, [change])
        moved = {m for m in METHODS if base.fingerprint(method=m) != other.fingerprint(method=m)}
        assert moved == methods, change
    assert base.fingerprint() != load_config(None, ["selection.tau=0.3"]).fingerprint()  # every key


def test_every_method_has_one_row_of_traits_and_the_bench_follows_it():
    """dots.config.TRAITS is the one place a method says what its step does; the params each
    method's runs ignore (`unread_sections`, every run key's) are derived from it, so the two cannot
    disagree."""
    from dots import bench_summary
    from dots.config import METHODS, TRAITS, unread_sections

    assert set(TRAITS) == set(METHODS)
    for method, traits in TRAITS.items():
        unused = set(unread_sections(method))
        assert ("selection" in unused) is not traits.selects, method
        assert ("predictor" in unused) is not traits.selects, method
        assert ("replay" in unused) is not traits.replays, method
        assert {p for p in bench_summary.PEERS if p not in unused} == ({traits.filters} if traits.filters else set()), method
    assert TRAITS["dots_rr"].selects and TRAITS["dots_rr"].replays and TRAITS["greso_rr"].filters == "greso"


@pytest.mark.parametrize("override", ["train.steps=true", "eval.every=yes", "train.lr=true",
                                      "train.target_accuracy=false"])
def test_a_yes_no_for_a_number_is_refused_naming_its_key(override):
    # pydantic read true as 1: one training step, an evaluation every step, without a word
    refused([override], override.split("=")[0], "a yes/no")


def test_train_methods_empty_or_repeated_is_refused():
    refused(["train.methods=[]"], "train.methods", "at least one")
    refused(["train.methods=[grpo, dots_rr, grpo]"], "train.methods", "['grpo'] given twice")


@pytest.mark.parametrize("backbone", ["sentence_transformers:all-MiniLM-L6-v2", "hf: ", "warm-up", "bert"])
def test_a_malformed_embed_backbone_is_refused_before_any_stage(backbone):
    # it was refused by the embed stage, after prepare and the whole warm-up
    refused([f"embed.backbone={backbone}"], "embed.backbone")


def test_a_dataset_spec_beside_the_synthetic_task_is_still_checked():
    refused(["task.dataset={path: x.parquet, colum: q}"], "task.dataset.colum")
    # unread: prepare says so
    assert load_config(None, ["task.dataset.path=x.parquet"]).task.source == "synthetic"


def test_a_params_file_with_a_section_given_twice_is_refused(tmp_path):
    # PyYAML keeps the last: the first train section's steps and method were dropped without a word
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  steps: 5\n  method: grpo\ntrain:\n  batch_size: 32\n")
    with pytest.raises(ConfigError, match="'train' is given twice") as info:
        load_config(params)
    assert "line 4" in str(info.value)
    params.write_text("train:\n  steps: 5\n  steps: 6\n")
    with pytest.raises(ConfigError, match="'steps' is given twice"):
        load_config(params)

