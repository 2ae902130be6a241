"""``data prepare``: tokenize a text corpus once into token shards and a manifest
(:mod:`training.prepare.shards`), streaming its source text (:mod:`~training.prepare.text_stream`)
through a tokenizer (:mod:`~training.prepare.tokenizer`). It runs on the user's machine only: the
VMs' bundle leaves this whole package out (``infra.startup.bundle.MACHINE_ONLY_PACKAGES``), and
nothing the VMs run imports it. docs/data.md."""
