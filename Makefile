# Thin wrapper over CMake: the two commands a newcomer needs are
#   make demo   build, then run the headline shape on the best backend
#   make test   build, then run every test (GPU tests skip without a GPU)
# Variables: BUILD (build dir), ARCHS (CUDA architectures, e.g. ARCHS=90a),
# CUDA (AUTO/ON/OFF), JOBS.
BUILD ?= build
ARCHS ?= 80;86;89;90a
CUDA ?= AUTO
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all configure build demo test check bench clean install

all: build

configure:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DFLASHCORE_CUDA=$(CUDA) "-DFLASHCORE_CUDA_ARCHS=$(ARCHS)"

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/flashcore demo

check: build
	$(BUILD)/flashcore check

bench: build
	$(BUILD)/flashcore bench --all

test: build
	ctest --test-dir $(BUILD) --output-on-failure

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)
