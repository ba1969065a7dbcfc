# kvq — two commands set everything up on a fresh Debian 12 machine:
#   make demo   install missing packages, build, run the main job on models/ref
#   make test   install missing packages, build, run every test with ctest, then the scalar-only build's tests
BUILD ?= build
JOBS  ?= $(shell nproc)

.PHONY: all deps build demo test test-scalar fuzz clean

all: build

deps:
	@bash scripts/install_deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

demo: build
	@bash scripts/demo.sh $(BUILD)/kvq

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory test-scalar

# The build a machine without x86-64 SIMD gets (-DKVQ_SIMD=OFF: scalar kernels only, no CUDA), and the tests of what
# the SIMD levels replace there: codecs, attention, rotations, linear layers, the model against its goldens (their
# files' own binary, kvq_portable_tests, whose ctest names start with portable/).
SCALAR_SUITES = Codecs Half CacheAttention SoftmaxKernels RotationFile Hadamard AttnRot Linear ModelGolden CpuRunner \
  Fp8Codecs Kitty Kv4rl LlamaCppTypes NexusCodec E8Lattice OscarCodecs OscarQuantizer PnmixCodec RopeKeyCodec \
  TurboQuantKeys TurboQuantValues TurboQuantFastPaths TurboQuantAttention
empty :=
space := $(empty) $(empty)
test-scalar: deps
	@cmake -S . -B build-scalar -DCMAKE_BUILD_TYPE=Release -DKVQ_SIMD=OFF -DKVQ_CUDA=OFF >/dev/null
	@cmake --build build-scalar -j $(JOBS) --target kvq_portable_tests -- --no-print-directory
	@cd build-scalar && for s in $(SCALAR_SUITES); do ctest -N -R "^portable/(.*/)?$$s\." | grep -q "Total Tests: [1-9]" \
	  || { echo "make test-scalar: no test of suite $$s in kvq_portable_tests (CMakeLists.txt's" \
	       "KVQ_PORTABLE_TEST_SOURCES)"; exit 1; }; done
	@cd build-scalar && ctest --output-on-failure -j $(JOBS) -R '^portable/(.*/)?($(subst $(space),|,$(strip $(SCALAR_SUITES))))\.'

# libFuzzer targets for what users hand in (clang), 60 s each: safetensors headers, config.json, the index of sharded
# checkpoints, rotation, PN-Mix and FP8 scales files, tokenizer.json and server requests.
fuzz: deps
	@bash scripts/run_fuzz.sh --install-deps
	@CXX=clang++ cmake -S . -B build-fuzz -DKVQ_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzz_safetensors fuzz_config fuzz_index fuzz_rotation fuzz_pnmix \
	  fuzz_fp8_scales fuzz_tokenizer fuzz_request
	@bash scripts/run_fuzz.sh build-fuzz 60

clean:
	rm -rf $(BUILD) build-scalar build-fuzz
