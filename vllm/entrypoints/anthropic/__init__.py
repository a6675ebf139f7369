"""The Anthropic Messages API on `vllm serve` (upstream: vllm/entrypoints/anthropic/).

`POST /v1/messages` and `POST /v1/messages/count_tokens`: a Messages request
is translated into a chat completion request, served by the same
`OpenAIServingChat` as /v1/chat/completions (templates, tool parsers,
reasoning parsers, structured outputs for forced tools), and the answer is
translated back (protocol.py: the bodies; serving_messages.py: the
translation; stream_converter.py: the SSE events; api_router.py: the routes
and Anthropic's error envelope).
"""
