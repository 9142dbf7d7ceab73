r"""Converts a checkpoint to a bass-jax directory (orbax) or back to a Hugging Face directory.

    python -m experiments.convert --from=path/to/hf_dir --to=converted/ --format=orbax
    python -m experiments.convert --from=converted/ --to=hf_again/ --format=safetensors

--from takes anything `bass_jax.load_model` reads (an HF directory of a supported family, a .gguf file,
an alias, an orbax directory, an EAGLE draft directory in either layout). The conversion is total: a
missing, extra or mis-shaped tensor, or a config field the port would ignore, stops it with an error
that names it. The tokenizer, if the source has one, is written too. An EAGLE draft
(`--from=smollm2-135m-eagle`) is written in its own layouts: --format=safetensors gives config.json +
model.safetensors (as `eagle_files.save_eagle` writes), --format=orbax config.json + params/; its stored
vocab_ids are the draft's V' (the rest of a shipped draft's frequency order is not carried over).
The parameters are written in --dtype (the dtype they are loaded in).

--to must not exist unless --overwrite is given; then it is replaced whole. The output is written into
a temporary sibling directory and renamed into place when complete, so a failed conversion leaves an
existing --to untouched (`bass_jax.save_model`).
"""

from absl import app
from absl import flags
from absl import logging

from experiments import _io

_FROM = flags.DEFINE_string("from", None, "Source checkpoint (HF dir, .gguf, alias, orbax dir).",
                            required=True)
_TO = flags.DEFINE_string("to", None, "Output directory.", required=True)
_FORMAT = flags.DEFINE_enum("format", "orbax", ["orbax", "safetensors"],
                            "orbax: config.json + params/ (bass-jax); safetensors: an HF directory.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "float16"], "Parameter dtype.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing --to directory whole.")


def main(argv):
  del argv
  _io.init_script()
  from bass_jax.checkpoints import atomic  # pylint: disable=g-import-not-at-top

  try:  # before loading anything: a bad --to fails at once
    atomic.check_destination(_TO.value, overwrite=_OVERWRITE.value)
  except (FileExistsError, NotADirectoryError) as e:
    raise app.UsageError(str(e)) from e
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top

  model = bass_jax.load_model(_FROM.value, dtype=jnp.dtype(_DTYPE.value))
  try:
    bass_jax.save_model(model, _TO.value, format=_FORMAT.value, overwrite=_OVERWRITE.value)
  except (FileExistsError, NotADirectoryError) as e:  # it appeared while we loaded
    raise app.UsageError(str(e)) from e
  logging.info("wrote %s (%s, %s, %d parameters)", _TO.value, model.config.model_type, _FORMAT.value,
               model.config.num_params())
  print(f"{_FROM.value} -> {_TO.value}: {model.config.model_type}, {model.config.num_params():,} "
        f"parameters, {_FORMAT.value}")


if __name__ == "__main__":
  _io.run(main)
