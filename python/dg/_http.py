"""A kept-alive HTTP/1.1 connection to one dg server (doc/http-api.md), with
the bearer token and dg's JSON errors turned into exceptions. http.client
rather than urllib.request: urllib opens a new connection per request."""

import http.client
import io
import json
import os
import ssl
import threading

import numpy as np

from . import errors

_RETRYABLE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
              http.client.CannotSendRequest, http.client.BadStatusLine)


def token_from_env(token=None, token_file=None):
    """The bearer token: the argument, else the first line of token_file, else
    $DG_TOKEN, else the first line of $DG_TOKEN_FILE; None without one."""
    if token:
        return token
    path = token_file or (None if os.environ.get("DG_TOKEN") else os.environ.get("DG_TOKEN_FILE"))
    if path:
        if os.stat(path).st_mode & 0o077:
            raise errors.from_dg("invalid_argument", "token file %s may be read by others "
                                 "(mode %04o)" % (path, os.stat(path).st_mode & 0o777),
                                 "chmod 600 %s" % path)
        with open(path) as f:
            return f.readline().strip()
    return os.environ.get("DG_TOKEN") or None


def split_target(target):
    """(scheme, "host:port") of a session target: grpc://, http://, https:// or a
    bare host:port (grpc:// is a spelling of dg's own HTTP address)."""
    t = target.strip()
    scheme = "http"
    for pre in ("grpc://", "http://", "https://"):
        if t.startswith(pre):
            scheme = "https" if pre == "https://" else "http"
            t = t[len(pre):]
            break
    t = t.rstrip("/")
    if not t or ":" not in t or "/" in t:
        raise errors.from_dg("invalid_argument", "session target %r is not "
                             "[grpc://|http://|https://]host:port" % target)
    if os.environ.get("DG_CA"):
        scheme = "https"
    return scheme, t


class Client:
    """Requests to one server over a kept-alive connection per thread (a
    session is used by queue runners' threads and the caller's at once)."""

    def __init__(self, address, token=None, timeout=600):
        self.scheme, self.address = split_target(address)
        self.token = token
        self.timeout = timeout
        self._tl = threading.local()
        self._lock = threading.Lock()
        self._all = set()               # every thread's open connection, for close()

    @property
    def _conn(self):
        return getattr(self._tl, "conn", None)

    @_conn.setter
    def _conn(self, conn):
        old = getattr(self._tl, "conn", None)
        with self._lock:
            if old is not None:
                self._all.discard(old)
            if conn is not None:
                self._all.add(conn)
        self._tl.conn = conn

    def _connect(self):
        host, _, port = self.address.rpartition(":")
        host = host.strip("[]")
        if self.scheme == "https":
            ctx = ssl.create_default_context(cafile=os.environ.get("DG_CA") or None)
            return http.client.HTTPSConnection(host, int(port), timeout=self.timeout,
                                               context=ctx)
        return http.client.HTTPConnection(host, int(port), timeout=self.timeout)

    def _drop(self):
        """Close this thread's connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self):
        """Close every thread's connection (a later request opens a new one)."""
        with self._lock:
            conns, self._all = self._all, set()
        for c in conns:
            c.close()
        self._tl.conn = None

    def request(self, method, path, body=None, headers=None, ok=(200, 201, 204)):
        """(status, response headers, body bytes); an answer outside ``ok`` raises
        the dg error it carries."""
        h = {"Connection": "keep-alive"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if isinstance(body, (dict, list)):
            body = json.dumps(body, allow_nan=False).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        for attempt in (0, 1):
            fresh = self._conn is None
            if fresh:
                self._conn = self._connect()
            try:
                self._conn.request(method, path, body=body, headers=h)
                resp = self._conn.getresponse()
                data = resp.read()
                break
            except _RETRYABLE as e:
                self._drop()
                if fresh or attempt:    # a kept-alive connection the server closed: once more
                    raise errors.from_dg("unavailable", "cannot reach %s://%s: %s"
                                         % (self.scheme, self.address, e)) from None
            except (OSError, http.client.HTTPException) as e:
                # HTTPException: the connection was closed under this thread
                # (the session closed while a queue runner's request ran)
                self._drop()
                raise errors.from_dg("unavailable", "cannot reach %s://%s: %s"
                                     % (self.scheme, self.address, e or type(e).__name__)
                                     ) from None
        if resp.getheader("Connection", "").lower() == "close":
            self._drop()
        if resp.status not in ok:
            raise error_of(resp.status, data, "%s %s" % (method, path))
        return resp.status, resp, data

    def get_json(self, path):
        return json.loads(self.request("GET", path)[2])

    def get_npy(self, path):
        data = self.request("GET", path, headers={"Accept": "application/x-npy"})[2]
        return np.load(io.BytesIO(data), allow_pickle=False)


def error_of(status, body, what):
    """The exception for an error answer: dg's {"error": {code, message, hint}}."""
    try:
        e = json.loads(body)["error"]
        return errors.from_dg(e.get("code", "internal"), e.get("message", ""), e.get("hint"))
    except (ValueError, KeyError, TypeError):
        text = body[:200].decode("utf-8", "replace")
        return errors.from_dg("unavailable" if status >= 500 else "invalid_argument",
                              "%s: HTTP %d %s" % (what, status, text))


def npy_bytes(array):
    """An array as .npy bytes (what the servers decode for uploads)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()
