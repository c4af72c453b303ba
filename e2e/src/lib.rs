//! Kiln end-to-end test harness.
