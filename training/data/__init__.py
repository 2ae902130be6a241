"""Training data whose batches are a pure function of the step: the shared error and dataset
interface (:mod:`training.data.base`), text files and their train/eval split
(:mod:`~training.data.files`), the byte reader (:mod:`~training.data.text`), the reader of a
prepared dataset (:mod:`~training.data.tokens`, with its :mod:`~training.data.manifest` and
:mod:`~training.data.storage`), which reader a source names (:mod:`~training.data.sources`), and
the options of ``data prepare`` (:mod:`~training.data.prepare_options`; the command itself is
:mod:`training.prepare`). docs/data.md."""
