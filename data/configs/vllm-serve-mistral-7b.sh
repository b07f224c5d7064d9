vllm serve mistralai/Mistral-7B-v0.1 \
    --max-model-len 2048
