"""Browser tests (Playwright on Debian's chromium)."""

# How long a browser step (a navigation, a wait for an element) may take before the test fails: a busy machine must
# only fail what never happens. 30 s was passed once: a CI rehearsal whose two suites ran side by side on a machine
# 2-3 times slower than usual (each suite 19.5 min instead of 11) took longer to load a GPU's page.
STEP_TIMEOUT_MS = 90_000
