"""C++ unit tests (tests/cpp), built with AddressSanitizer and UBSan."""

import shutil

import pytest

from cpp_units import compile_objects, link_and_run

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

WIRE = ["csrc/wire/frame.cpp", "csrc/wire/messages.cpp", "csrc/common/object_meta.cpp"]
LOOP = ["csrc/net/event_loop.cpp", "csrc/common/logging.cpp"]
TCP = ["csrc/net/tcp/tcp_connection.cpp", "csrc/net/sockets.cpp", *LOOP, "csrc/wire/frame.cpp"]

# Each binary (tests/cpp/<name>.cpp: what it checks): its test file and the sources it links.
UNITS = {
    "test_wire": ["tests/cpp/test_wire.cpp", *WIRE],
    "test_reduce": ["tests/cpp/test_reduce.cpp", "csrc/coll/reduce_plan.cpp", "csrc/coll/reduce_kernels.cpp"],
    "test_event_loop": ["tests/cpp/test_event_loop.cpp", *LOOP],
    "test_tcp_queue": ["tests/cpp/test_tcp_queue.cpp", *TCP],
    "test_tcp_read": ["tests/cpp/test_tcp_read.cpp", *TCP],
    "test_directory_client": ["tests/cpp/test_directory_client.cpp", "csrc/directory/directory_client.cpp",
                              "csrc/store/object_store.cpp", "csrc/store/local_object.cpp",
                              "csrc/store/buffer_pool.cpp", *LOOP, *WIRE],
    "test_directory_shard": ["tests/cpp/test_directory_shard.cpp", "csrc/directory/directory_shard.cpp", *LOOP, *WIRE],
    "test_mailbox": ["tests/cpp/test_mailbox.cpp", "csrc/messenger/mailbox.cpp", "csrc/store/buffer_pool.cpp",
                     *LOOP, *WIRE],
    "test_buffer_pool": ["tests/cpp/test_buffer_pool.cpp", "csrc/store/buffer_pool.cpp"],
    "test_recent_ids": ["tests/cpp/test_recent_ids.cpp"],
}


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    return compile_objects(tmp_path_factory.mktemp("cpp_objects"), {s for srcs in UNITS.values() for s in srcs})


@pytest.mark.parametrize("name", UNITS)
def test_cpp_unit_passes_its_checks(objects, tmp_path, name):
    link_and_run(tmp_path / name, [objects[s] for s in UNITS[name]])
