// The EHR advertises authorize-post: send the authorization request as a form post, at once.
document.getElementById("authorize-post").submit();
