// An error page served at /callback: the address still holds the one-time authorization code.
// Replace it, so the code is neither bookmarked, shared nor kept in the history.
if (window.location.pathname === "/callback") window.history.replaceState(null, "", "/launch/error");
