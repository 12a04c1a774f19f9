"""The built-in model pair: corpus (`corpus`), tokenizer (`tokenizer`), training (`train`),
measurement (`evaluate`), the model card (`card`), and the shipped weights under `weights/`."""
