"""Hub models offline: a model the local Hugging Face cache lacks is one line naming its key and
the command that fetches it, before the stage's work (it was transformers' traceback from inside
the warm-up, after `dots all` had prepared the data)."""

from __future__ import annotations

import json

import pytest
from huggingface_hub import constants

from dots.cli import config_models, main
from dots.hub import require_cached

from .conftest import REPO


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty HF cache, offline; `add(name)` lays out a cached snapshot as the hub client does."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def add(name: str, files: dict[str, str] | None = None) -> None:
        repo = cache / f"models--{name.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text("0123abc")
        (repo / "snapshots" / "0123abc").mkdir(parents=True, exist_ok=True)
        files = files or {"config.json": "{}", "model.safetensors": "weights", "tokenizer.json": "{}"}
        for file, text in files.items():
            (repo / "snapshots" / "0123abc" / file).write_text(text)

    return add


def test_a_missing_hub_model_is_named_with_its_key_and_the_fetch_command(hub_cache, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as exc:
        require_cached({"model.pretrained": "org/policy", "embed.backbone": "org/backbone"})
    text = str(exc.value)
    assert text.startswith("model.pretrained: org/policy; embed.backbone: org/backbone: "
                           "not in the Hugging Face cache")
    assert "`hf download org/policy && hf download org/backbone`" in text and "HF_HUB_OFFLINE=0" in text
    hub_cache("org/policy")
    # the missing one only
    with pytest.raises(FileNotFoundError, match=r"^embed.backbone: org/backbone: not in"):
        require_cached({"model.pretrained": "org/policy", "embed.backbone": "org/backbone"})
    hub_cache("org/backbone")
    require_cached({"model.pretrained": "org/policy", "embed.backbone": "org/backbone"})
    # a local folder, an unset key, and online (transformers downloads) are not checked
    local = tmp_path / "org" / "local"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    require_cached({"model.pretrained": "org/local", "embed.backbone": None})
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    require_cached({"model.pretrained": "org/nowhere"})


def test_a_model_downloaded_in_part_is_named_with_what_it_lacks(hub_cache):
    """The hub client links a file into the snapshot once it is whole: a download cut short leaves
    the config and some of the weights, which a config-only check passed and `from_pretrained`
    then failed on, inside the stage."""
    index = json.dumps({"weight_map": {f"layer{i}": f"model-0000{i % 3 + 1}-of-00003.safetensors"
                                       for i in range(9)}})
    hub_cache("org/sharded", {"config.json": "{}", "model.safetensors.index.json": index,
                              "model-00001-of-00003.safetensors": "w",
                              "model-00003-of-00003.safetensors": "w", "vocab.json": "{}"})
    hub_cache("org/bare", {"config.json": "{}", "tokenizer.model": "sp"})
    refs = {"model.pretrained": "org/sharded", "embed.backbone": "org/bare", "other": "org/nowhere"}
    with pytest.raises(FileNotFoundError) as exc:
        require_cached(refs)
    assert str(exc.value).startswith(
        "other: org/nowhere: not in the Hugging Face cache (")
    said = str(exc.value)
    assert ("; model.pretrained: org/sharded: in the Hugging Face cache without "
            "model-00002-of-00003.safetensors (a download cut short?); embed.backbone: org/bare: in the "
            "Hugging Face cache without model.safetensors (a download cut short?), and dots runs "
            "offline") in said
    assert "`hf download org/nowhere && hf download org/sharded && hf download org/bare`" in said
    hub_cache("org/sharded", {"model-00002-of-00003.safetensors": "w"})  # the download finished
    hub_cache("org/bare", {"pytorch_model.bin": "w"})
    require_cached({"model.pretrained": "org/sharded", "embed.backbone": "org/bare"})


def test_a_model_without_a_tokenizer_is_named_before_any_work(hub_cache):
    """`hf download NAME config.json model.safetensors` caches a model without its tokenizer, which the
    weights check passed and `AutoTokenizer` then failed on, inside the stage."""
    hub_cache("org/untokenized", {"config.json": "{}", "model.safetensors": "w"})
    with pytest.raises(FileNotFoundError) as exc:
        require_cached({"model.pretrained": "org/untokenized"})
    assert str(exc.value).startswith("model.pretrained: org/untokenized: in the Hugging Face cache without "
                                     "tokenizer files (a download cut short?)")
    assert "`hf download org/untokenized`" in str(exc.value)
    hub_cache("org/untokenized", {"vocab.txt": "[PAD]"})  # a BERT-style backbone's one file is enough
    require_cached({"model.pretrained": "org/untokenized"})


def test_the_config_names_its_policy_and_an_hf_backbone():
    from dots.config import load_config

    profile = load_config(REPO / "configs" / "qwen2.5-math-1.5b-deepscaler.yaml")
    assert config_models(profile) == {"model.pretrained": "Qwen/Qwen2.5-Math-1.5B",
                                      "embed.backbone": "Qwen/Qwen2.5-Math-1.5B-Instruct"}
    assert config_models(profile, backbone=False) == {"model.pretrained": "Qwen/Qwen2.5-Math-1.5B"}
    assert config_models(load_config(None)) == {"model.pretrained": None}  # the embedded default: none


@pytest.mark.parametrize("command", ["all", "warmup", "train"])
def test_the_cli_refuses_an_uncached_policy_in_one_line_before_any_work(hub_cache, tmp_path, capsys, command):
    root = tmp_path / "artifacts"
    argv = [command, "-p", str(REPO / "params.yaml"), "-S", f"paths.root={root}",
            "-S", "model.pretrained=org/missing", "-S", "embed.backbone=hf:org/missing-embedder",
            "-S", "label.policies=[final]"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"dots {command}: model.pretrained: org/missing")
    assert "`hf download org/missing" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert ("embed.backbone: org/missing-embedder" in err) == (command == "all")  # only `all` embeds
    assert not (root / "data").exists()  # `dots all` stopped before preparing the data


def test_a_sentence_transformers_backbone_is_named_as_the_hub_knows_it(tmp_path, monkeypatch):
    """sentence-transformers reads a bare name as its own organisation's model; a folder stays a path;
    before 2.3 the library kept its models outside the Hugging Face cache, so none is checked there."""
    import importlib.metadata

    from dots.config import load_config

    def named(backbone: str) -> dict:
        return config_models(load_config(None, [f"embed.backbone={backbone}"]), policy=False)

    assert named("sentence-transformers:all-MiniLM-L6-v2") == {
        "embed.backbone": "sentence-transformers/all-MiniLM-L6-v2"}
    assert named("sentence-transformers:BAAI/bge-small-en-v1.5") == {
        "embed.backbone": "BAAI/bge-small-en-v1.5"}
    folder = tmp_path / "encoder"
    folder.mkdir()
    assert named(f"sentence-transformers:{folder}") == {"embed.backbone": str(folder)}
    assert named("warmup") == {}
    version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "2.2.2" if name == "sentence-transformers" else version(name))
    assert named("sentence-transformers:all-MiniLM-L6-v2") == {}


@pytest.mark.parametrize("command", ["all", "embed"])
def test_a_sentence_transformers_backbone_this_machine_cannot_load_is_one_line_before_any_work(
        hub_cache, tmp_path, capsys, monkeypatch, command):
    """Without the package, the embed stage found out only when it encoded (`dots all`: after the
    warm-up); offline without the model in the cache, SentenceTransformer's own traceback, as late."""
    import importlib.machinery
    import importlib.util

    root = tmp_path / "artifacts"
    argv = [command, "-p", str(REPO / "params.yaml"), "-S", f"paths.root={root}",
            "-S", "embed.backbone=sentence-transformers:all-MiniLM-L6-v2"]
    if importlib.util.find_spec("sentence_transformers") is None:
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.strip() == (f"dots {command}: embed.backbone: sentence-transformers is not installed "
                               "(pip install sentence-transformers), or use embed.backbone: warmup or "
                               "hf:<name or path>")
        assert not (root / "data").exists()
        find_spec = importlib.util.find_spec  # installed, from here on
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: importlib.machinery.ModuleSpec(
            name, None) if name == "sentence_transformers" else find_spec(name, *rest))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"dots {command}: embed.backbone: sentence-transformers/all-MiniLM-L6-v2: not in "
                          "the Hugging Face cache")
    assert "`hf download sentence-transformers/all-MiniLM-L6-v2" in err and "Traceback" not in err
    assert not (root / "data").exists()


@pytest.mark.parametrize("override, said", [
    ("train.device=cuda", "train.device: 'cuda' asked for but no GPU is visible"),
    ("rollout.engine=vllm", "rollout.engine: 'vllm' needs the gpu extra (pip install 'dots[gpu]') and a GPU; "
                            "vllm is not installed")])
@pytest.mark.parametrize("command", ["all", "train"])
def test_a_gpu_or_vllm_this_machine_lacks_is_one_line_before_any_work(tmp_path, capsys, override, said,
                                                                      command):
    """`dots train -S train.device=cuda` on a CPU machine was a traceback from inside the trainer, and
    `rollout.engine=vllm` without the gpu extra one from the engine, after the policy had loaded
    (`dots all`: after preparing the data)."""
    import importlib.util

    import torch

    if torch.cuda.is_available() or importlib.util.find_spec("vllm") is not None:
        pytest.skip("this machine has a GPU or vLLM")
    root = tmp_path / "artifacts"
    assert main([command, "-p", str(REPO / "params.yaml"), "-S", f"paths.root={root}", "-S", override]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"dots {command}: {said}"
    assert not (root / "data").exists()


def test_load_policy_says_the_same_for_a_hub_name_not_in_the_cache(hub_cache):
    from dots.models import load_policy

    with pytest.raises(FileNotFoundError, match="model: org/missing: not in the Hugging Face cache"):
        load_policy("org/missing")
    # the embed stage names the key its backbone came from
    with pytest.raises(FileNotFoundError, match="^embed.backbone: org/embedder: not in the Hugging Face"):
        load_policy("org/embedder", key="embed.backbone")
