"""The token core, family-agnostic: text ↔ ids and messages → text. Vocabularies rebuilt from
registry packages (:mod:`~backend.tokens.vocab`, :mod:`~backend.tokens.bpe`), trl's chat templates
(:mod:`~backend.tokens.trl_templates`), rendering messages and tools through a template or a
family's renderer to text, ids and per-message spans (:mod:`~backend.tokens.rendering`), untrusted
templates rendered in capped workers (:mod:`~backend.tokens.template_guard`) and the one line a
template error becomes (:mod:`~backend.tokens.template_errors`). The families build on this
package, so nothing here imports a family, the loading layer (tokenizers by profile, models) or
anything above: what a module needs of a family comes in as an argument. A family's own recipe,
rule or renderer belongs in :mod:`backend.families`; loading a profile, hub id or folder belongs in
:mod:`backend.loading`.
"""
