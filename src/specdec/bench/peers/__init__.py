"""The peers ``specdec bench`` measures specdec against, one file each, registered by name
(:func:`specdec.bench.base.peer`): transformers (``hf``), llama-cpp-python (``llamacpp``), vLLM on
CPU (``vllm``) and llama.cpp's own server (``llama_server``)."""
