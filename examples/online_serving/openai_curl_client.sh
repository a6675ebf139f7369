#!/usr/bin/env bash
# The OpenAI-compatible API with curl: list the models, one completion, one chat completion, one stream.
#
#   vllm serve            # the embedded model on localhost:8000
#   bash examples/online_serving/openai_curl_client.sh
#
# BASE_URL (default http://localhost:8000) and MODEL (default: the server's
# first model, read from /v1/models) select the server and the model;
# MAX_TOKENS bounds each answer. With `vllm serve --api-key KEY`, set API_KEY.
set -euo pipefail

BASE_URL="${BASE_URL:-http://localhost:8000}"
MAX_TOKENS="${MAX_TOKENS:-32}"
AUTH=(-H "Authorization: Bearer ${API_KEY:-EMPTY}")

echo "== GET /v1/models"
MODELS=$(curl -sS --fail-with-body "${AUTH[@]}" "$BASE_URL/v1/models")
echo "$MODELS"
MODEL="${MODEL:-$(printf '%s' "$MODELS" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')}"

echo "== POST /v1/completions"
curl -sS --fail-with-body "${AUTH[@]}" "$BASE_URL/v1/completions" \
    -H "Content-Type: application/json" \
    -d "{\"model\": \"$MODEL\", \"prompt\": \"The capital of France is\",
         \"max_tokens\": $MAX_TOKENS, \"temperature\": 0}"
echo

echo "== POST /v1/chat/completions"
curl -sS --fail-with-body "${AUTH[@]}" "$BASE_URL/v1/chat/completions" \
    -H "Content-Type: application/json" \
    -d "{\"model\": \"$MODEL\", \"max_tokens\": $MAX_TOKENS, \"temperature\": 0,
         \"messages\": [{\"role\": \"user\", \"content\": \"Say hello.\"}]}"
echo

echo "== POST /v1/completions (stream: server-sent events, one data: line per chunk)"
curl -sS -N --fail-with-body "${AUTH[@]}" "$BASE_URL/v1/completions" \
    -H "Content-Type: application/json" \
    -d "{\"model\": \"$MODEL\", \"prompt\": \"Once upon a time\",
         \"max_tokens\": $MAX_TOKENS, \"temperature\": 0, \"stream\": true}"
