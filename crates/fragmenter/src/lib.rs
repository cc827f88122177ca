//! Shape free memory into a target buddyinfo profile.
