"""C++ unit tests (tests/cpp), built with AddressSanitizer and UBSan."""

import shutil

import pytest

from cpp_units import build_and_run

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@needs_gxx
def test_wire_decoder_rejects_truncated_oversized_and_garbage_frames(tmp_path):
    build_and_run(
        tmp_path,
        "test_wire",
        ["tests/cpp/test_wire.cpp", "csrc/wire/frame.cpp", "csrc/wire/messages.cpp", "csrc/common/object_meta.cpp"],
    )


@needs_gxx
def test_reduce_trees_cost_model_and_kernels(tmp_path):
    build_and_run(
        tmp_path,
        "test_reduce",
        ["tests/cpp/test_reduce.cpp", "csrc/coll/reduce_plan.cpp", "csrc/coll/reduce_kernels.cpp"],
    )


@needs_gxx
def test_event_loop_turns_give_timers_posts_and_events_a_turn_during_soon_chains(tmp_path):
    build_and_run(
        tmp_path,
        "test_event_loop",
        ["tests/cpp/test_event_loop.cpp", "csrc/net/event_loop.cpp", "csrc/common/logging.cpp"],
    )


@needs_gxx
def test_tcp_connection_shares_by_bytes_between_flows_and_lets_control_frames_overtake(tmp_path):
    build_and_run(
        tmp_path,
        "test_tcp_queue",
        ["tests/cpp/test_tcp_queue.cpp", "csrc/net/tcp/tcp_connection.cpp", "csrc/net/sockets.cpp",
         "csrc/net/event_loop.cpp", "csrc/common/logging.cpp", "csrc/wire/frame.cpp"],
    )


@needs_gxx
def test_tcp_connection_reads_frames_cut_at_any_byte_with_read_ahead(tmp_path):
    build_and_run(
        tmp_path,
        "test_tcp_read",
        ["tests/cpp/test_tcp_read.cpp", "csrc/net/tcp/tcp_connection.cpp", "csrc/net/sockets.cpp",
         "csrc/net/event_loop.cpp", "csrc/common/logging.cpp", "csrc/wire/frame.cpp"],
    )


@needs_gxx
def test_directory_client_tells_every_live_member_of_moves(tmp_path):
    build_and_run(
        tmp_path,
        "test_directory_client",
        ["tests/cpp/test_directory_client.cpp", "csrc/directory/directory_client.cpp", "csrc/store/object_store.cpp",
         "csrc/store/local_object.cpp", "csrc/store/buffer_pool.cpp", "csrc/net/event_loop.cpp",
         "csrc/common/logging.cpp", "csrc/wire/frame.cpp", "csrc/wire/messages.cpp", "csrc/common/object_meta.cpp"],
    )


@needs_gxx
def test_directory_shard_tokens_hand_over_and_standby(tmp_path):
    build_and_run(
        tmp_path,
        "test_directory_shard",
        ["tests/cpp/test_directory_shard.cpp", "csrc/directory/directory_shard.cpp", "csrc/net/event_loop.cpp",
         "csrc/common/logging.cpp", "csrc/wire/frame.cpp", "csrc/wire/messages.cpp", "csrc/common/object_meta.cpp"],
    )
