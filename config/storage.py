"""Static files in production: WhiteNoise's compressed, hashed copies, with the relative imports
of the browser's ES modules (static/js/chat/) rewritten to the hashed names too, so a page
never runs one deploy's entry module against another's cached imports."""

from whitenoise.storage import CompressedManifestStaticFilesStorage


class StaticFilesStorage(CompressedManifestStaticFilesStorage):
    support_js_module_import_aggregation = True
