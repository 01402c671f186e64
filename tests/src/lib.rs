//! mountguard cluster-in-a-box: test doubles that speak the real protocols.
