"""Cluster URLs keep the ACL user, the password and TLS; their errors never show the password."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwater.pipelines.store.connect import StoreURLError, cluster_options, is_cluster_url


def test_a_tls_cluster_url_keeps_user_password_and_files() -> None:
    url = "rediss-cluster://headwater:p%40ss@127.0.0.1:7000?ssl_ca_certs=/ca.pem&ssl_check_hostname=true"
    assert is_cluster_url(url)
    assert cluster_options(url) == {
        "host": "127.0.0.1",
        "port": 7000,
        "username": "headwater",
        "password": "p@ss",
        "ssl": True,
        "ssl_ca_certs": "/ca.pem",
        "ssl_check_hostname": True,
    }


def test_a_plain_cluster_url_keeps_the_password() -> None:
    assert cluster_options("redis-cluster://:pw@h:7000") == {"host": "h", "port": 7000, "password": "pw"}


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis-cluster://u:pw-secret@h:7000/3", "only database 0"),
        ("redis-cluster://u:pw-secret@h:x", "the port must be a number"),
        ("redis-cluster://u:pw-secret@h:7000?ssl_ca_certs=/ca.pem", "need rediss-cluster://"),
        ("rediss-cluster://u:pw-secret@h:7000?nope=1", "unknown option nope"),
    ],
)
def test_bad_cluster_urls_are_explained_without_the_password(url: str, expected: str) -> None:
    with pytest.raises(StoreURLError, match=expected) as caught:
        cluster_options(url)
    assert "pw-secret" not in str(caught.value)
    assert "u:***@h" in str(caught.value)


@given(password=st.text(st.characters(codec="ascii", categories=["L", "N", "P"]), min_size=8))
def test_no_cluster_url_error_shows_its_password(password: str) -> None:
    # A password with "/", "#" or "[" unencoded breaks the URL apart: still refused, still masked.
    url = f"redis-cluster://user:{password}@host:7000/5"
    with pytest.raises(StoreURLError) as caught:
        cluster_options(url)
    assert password not in str(caught.value)
