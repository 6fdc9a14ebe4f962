"""A config naming a package of a missing extra says which extra to install."""

from __future__ import annotations

from rb_lightning.runs.config_errors import parse_error


def test_a_missing_optional_package_names_its_extra():
    # What a user of an [rl]-only install met on configs/llm_sft.yaml: "No module named
    # 'transformers'" and nothing about the [hf] extra. jsonargparse chains the ImportError
    # under its class_path error, as here.
    try:
        raise ImportError("No module named 'transformers'")
    except ImportError as missing:
        try:
            raise ValueError(
                "Problem with given class_path 'transformers.LlamaConfig':"
            ) from missing
        except ValueError as error:
            parsed = parse_error(error)
    said = str(parsed)
    assert 'the hf extra: pip install "rb-lightning[hf]"' in said, said
    assert "No module named 'transformers'" in said
