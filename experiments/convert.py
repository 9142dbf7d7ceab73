r"""Converts a checkpoint to a bass-jax directory (orbax) or back to a Hugging Face directory.

    python -m experiments.convert --from=path/to/hf_dir --to=converted/ --format=orbax
    python -m experiments.convert --from=converted/ --to=hf_again/ --format=safetensors

--from takes anything `bass_jax.load_model` reads (an HF directory of a supported family, a .gguf file,
an alias, an orbax directory). The conversion is total: a missing, extra or mis-shaped tensor, or a
config field the port would ignore, stops it with an error that names it. The tokenizer, if the source
has one, is written too.
"""

from absl import app
from absl import flags
from absl import logging
import jax.numpy as jnp

import bass_jax

_FROM = flags.DEFINE_string("from", None, "Source checkpoint (HF dir, .gguf, alias, orbax dir).",
                            required=True)
_TO = flags.DEFINE_string("to", None, "Output directory.", required=True)
_FORMAT = flags.DEFINE_enum("format", "orbax", ["orbax", "safetensors"],
                            "orbax: config.json + params/ (bass-jax); safetensors: an HF directory.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "float16"], "Parameter dtype.")


def main(argv):
  del argv
  model = bass_jax.load_model(_FROM.value, dtype=jnp.dtype(_DTYPE.value))
  bass_jax.save_model(model, _TO.value, format=_FORMAT.value)
  logging.info("wrote %s (%s, %s, %d parameters)", _TO.value, model.config.model_type, _FORMAT.value,
               model.config.num_params())
  print(f"{_FROM.value} -> {_TO.value}: {model.config.model_type}, {model.config.num_params():,} "
        f"parameters, {_FORMAT.value}")


if __name__ == "__main__":
  app.run(main)
