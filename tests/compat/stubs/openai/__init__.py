"""A small stand-in for the `openai` Python package (not installable here), implementing only what
llama-server's test suite uses: OpenAI(api_key, base_url) with chat.completions, completions,
embeddings and responses `.create(...)`, streaming over server-sent events, and the exception types.
Responses come back as attribute-access objects where an absent field reads as None, as the real
package's pydantic models do for optional fields."""

import json
import urllib.error
import urllib.request

__all__ = ["OpenAI", "OpenAIError", "APIError", "APIStatusError", "APIConnectionError",
           "APITimeoutError", "BadRequestError", "AuthenticationError", "PermissionDeniedError",
           "NotFoundError", "UnprocessableEntityError", "RateLimitError", "InternalServerError"]


class OpenAIError(Exception):
    pass


class APIError(OpenAIError):
    def __init__(self, message, body=None):
        super().__init__(message)
        self.message = message
        self.body = body


class APIConnectionError(APIError):
    pass


class APITimeoutError(APIConnectionError):
    pass


class APIStatusError(APIError):
    def __init__(self, message, status_code, body=None):
        super().__init__(message, body)
        self.status_code = status_code


class BadRequestError(APIStatusError):
    pass


class AuthenticationError(APIStatusError):
    pass


class PermissionDeniedError(APIStatusError):
    pass


class NotFoundError(APIStatusError):
    pass


class UnprocessableEntityError(APIStatusError):
    pass


class RateLimitError(APIStatusError):
    pass


class InternalServerError(APIStatusError):
    pass


_STATUS_ERRORS = {400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError,
                  404: NotFoundError, 422: UnprocessableEntityError, 429: RateLimitError}


def _wrap(value):
    if isinstance(value, dict):
        return _Obj(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


class _Obj:
    """A JSON object read by attribute (res.choices[0].message.content) or by key."""

    def __init__(self, data):
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "output_text" and name not in self._data and self._data.get("object") == "response":
            # the real package's Response.output_text: the output_text parts of its message items
            return "".join(part.get("text", "") for item in self._data.get("output") or []
                           if item.get("type") == "message"
                           for part in item.get("content") or [] if part.get("type") == "output_text")
        return _wrap(self._data.get(name))

    def __getitem__(self, key):
        return _wrap(self._data[key])

    def __contains__(self, key):
        return key in self._data

    def __repr__(self):
        return f"{type(self).__name__}({self._data!r})"

    def model_dump(self, **_):
        return self._data

    def to_dict(self, **_):
        return self._data

    def model_dump_json(self, **_):
        return json.dumps(self._data)


class Stream:
    """Iterates the server-sent events of a streamed answer, one object per `data:` line."""

    def __init__(self, response):
        self.response = response

    def __iter__(self):
        with self.response:
            for raw in self.response:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                data = json.loads(payload)
                if isinstance(data, dict) and "error" in data and len(data) == 1:
                    raise APIError(str(data["error"]), data)
                yield _wrap(data)

    def close(self):
        self.response.close()


class _Client:
    def __init__(self, api_key, base_url, timeout):
        self.api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def post(self, path, body):
        body = {k: v for k, v in body.items() if v is not None}
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        for k, v in (body.pop("extra_headers", None) or {}).items():
            headers[k] = v
        extra = body.pop("extra_body", None) or {}
        body.update(extra)
        body.pop("timeout", None)
        req = urllib.request.Request(self.base_url + path, data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = text
            cls = _STATUS_ERRORS.get(e.code, InternalServerError if e.code >= 500 else APIStatusError)
            raise cls(f"Error code: {e.code} - {text}", e.code, parsed) from None
        except urllib.error.URLError as e:
            raise APIConnectionError(str(e)) from None
        if body.get("stream"):
            return Stream(resp)
        with resp:
            return _wrap(json.loads(resp.read().decode("utf-8")))


class _Endpoint:
    def __init__(self, client, path):
        self._client = client
        self._path = path

    def create(self, **kwargs):
        return self._client.post(self._path, kwargs)


class _Chat:
    def __init__(self, client):
        self.completions = _Endpoint(client, "/chat/completions")


class OpenAI:
    def __init__(self, api_key=None, base_url=None, timeout=600, max_retries=0, **_):
        self._client = _Client(api_key, base_url or "https://api.openai.com/v1", timeout)
        self.api_key = api_key
        self.base_url = self._client.base_url
        self.chat = _Chat(self._client)
        self.completions = _Endpoint(self._client, "/completions")
        self.embeddings = _Endpoint(self._client, "/embeddings")
        self.responses = _Endpoint(self._client, "/responses")
