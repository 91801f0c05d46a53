"""POST /v1/completions to a node's router on loopback. Standard library only."""
import http.client
import json


def post_completion(port, body, timeout=180):
    """One POST /v1/completions of `body` (a dict) to 127.0.0.1:`port`: (HTTP status, headers
    with lower-case names, the reply parsed from JSON or its text when it is not JSON), or
    (0, {}, repr(error)) when no answer came."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read().decode(errors="replace")
        headers = {k.lower(): v for k, v in resp.getheaders()}
        conn.close()
        try:
            return resp.status, headers, json.loads(raw)
        except ValueError:
            return resp.status, headers, raw
    except (OSError, http.client.HTTPException) as e:
        return 0, {}, repr(e)
