//! keelson agent library
