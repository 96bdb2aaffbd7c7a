"""Bundles: a model, its tokenizer, an index, a passage store and a query encoder, with a manifest.

`build_bundle` assembles one, `open_bundle` opens one (layout, sizes, and the
hashes of files changed since last verified), `verify` checks every hash,
`load_agent` turns a bundle (or a model and an index, or the default bundle
built on first use) into an Agent, `load_pool` into the pool of agents `serve`
uses. Layout: `core.py`.
"""

from .core import (FORMAT, MANIFEST, Bundle, build_bundle, check_files, open_bundle, protocol_config,
                   read_manifest, verify)
from .default import (ENV_CORPUS, cache_root, default_bundle_dir, default_model_path,
                      ensure_default_bundle)
from .loader import load_agent, load_pool

__all__ = ["ENV_CORPUS", "FORMAT", "MANIFEST", "Bundle", "build_bundle", "cache_root", "check_files",
           "default_bundle_dir", "default_model_path", "ensure_default_bundle", "load_agent", "load_pool",
           "open_bundle", "protocol_config", "read_manifest", "verify"]
