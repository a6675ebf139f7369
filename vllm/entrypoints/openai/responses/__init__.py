"""The Responses API (/v1/responses): see serving.py."""
